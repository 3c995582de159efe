"""``dbqueue server``: named locks and "work available" pushes over TCP.

One asyncio task per connection, no thread per client. The server keeps only what dies with its
clients — which connection holds which named lock, and which idle connection wants wake-ups for
which queues — so restarting it loses nothing: the jobs, their states and their history stay in
the database. A lock belongs to one (connection, owner) pair and is released the moment that
connection drops, which is what lets the workers' rescue routine tell a dead worker's job from a
live one.

Defences, each with its own limit: a connection must say ``hello`` within the message timeout;
every message must arrive whole within the message timeout of its first byte; a connection silent
for longer than the idle timeout (clients ping at a third of it) is dropped, and its locks with
it; a frame over the size limit, or anything that is not a frame, drops the connection; at most
``max_clients`` connections are served at once; a reply that a client does not read within the
message timeout, or pushes piling up unread, drop it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import protocol
from .protocol import Address, ProtocolError

log = logging.getLogger("dbqueue.lockserver")

#: Unread pushes a client may accumulate before the server gives up on it.
MAX_PENDING_BYTES = 256 * 1024


@dataclass(frozen=True)
class ServerConfig:
    """What ``dbqueue server`` is configured with (the seed's variable names in comments)."""

    bind: str = "127.0.0.1"
    port: int = protocol.DEFAULT_LOCK_PORT  # LOCK_SERVICE_PORT
    notify_port: int | None = protocol.DEFAULT_NOTIFY_PORT  # NOTIFY_SERVICE_PORT
    token: str | None = None
    max_clients: int = 50  # MAX_CLIENT_THREADS
    message_timeout: float = protocol.DEFAULT_MESSAGE_TIMEOUT  # TIMEOUT_SOCKET_MESSAGE
    idle_timeout: float = protocol.DEFAULT_IDLE_TIMEOUT  # LOCK_SERVICE_WAIT_CONN_INTERVAL
    check_interval: float = 15.0  # CHECK_TASKS_INTERVAL


class _Client:
    __slots__ = ("number", "peer", "writer", "name", "locks", "queues")

    def __init__(self, number: int, peer: str, writer: asyncio.StreamWriter) -> None:
        self.number = number
        self.peer = peer
        self.writer = writer
        self.name = ""
        self.locks: set[str] = set()
        self.queues: set[str] = set()

    def __str__(self) -> str:
        return f"client {self.number} ({self.name or '?'} from {self.peer})"


class LockServer:
    """The protocol's state machine; ``run()`` serves it until ``stop()``.

    ``poll`` returns the queues that hold runnable jobs (it reads the database, in a thread);
    the server calls it every ``check_interval`` seconds and wakes those queues' subscribers.
    """

    def __init__(self, config: ServerConfig, poll: Callable[[], Sequence[str]] | None = None):
        self.config = config
        self.poll = poll
        self.server_id = secrets.token_hex(6)
        self.locks: dict[str, tuple[_Client, str]] = {}
        self.clients: set[_Client] = set()
        self.connections = 0
        self.addresses: list[Address] = []
        self._numbers = 0
        self._stop: asyncio.Event | None = None
        self._poll_failing = False

    # ---- lifecycle ----------------------------------------------------------------------------
    async def run(self, on_ready: Callable[[list[Address]], None] | None = None) -> None:
        self._stop = asyncio.Event()
        ports = [self.config.port]
        if self.config.notify_port is not None and self.config.notify_port != self.config.port:
            ports.append(self.config.notify_port)
        servers = []
        try:
            for port in ports:
                server = await asyncio.start_server(self._serve, self.config.bind, port)
                servers.append(server)
                sockname = server.sockets[0].getsockname()
                self.addresses.append(Address(self.config.bind, sockname[1]))
            if on_ready is not None:
                on_ready(self.addresses)
            poller = asyncio.create_task(self._poll_loop()) if self.poll else None
            await self._stop.wait()
            if poller is not None:
                poller.cancel()
        finally:
            for server in servers:
                server.close()
            for client in list(self.clients):
                client.writer.close()
            for server in servers:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server.wait_closed(), self.config.message_timeout)

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    # ---- one connection -----------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer)
        if self.connections >= self.config.max_clients:
            log.warning(
                "refused %s: %d clients already (MAX_CLIENT_THREADS)", peer, self.connections
            )
            await self._refuse(
                writer,
                f"server full: it serves at most {self.config.max_clients} "
                "clients (MAX_CLIENT_THREADS)",
            )
            return
        self.connections += 1
        self._numbers += 1
        client = _Client(self._numbers, peer, writer)
        try:
            hello = await self._read(reader, self.config.message_timeout)
            problem = self._check_hello(hello)
            if problem is not None:
                log.warning("refused %s: %s", peer, problem)
                await self._send(client, {"op": "error", "ok": False, "error": problem})
                return
            client.name = str(hello.get("client") or "")[:200]
            self.clients.add(client)
            await self._send(
                client,
                {
                    "ok": True,
                    "version": protocol.VERSION,
                    "server": self.server_id,
                    "idle_timeout": self.config.idle_timeout,
                },
            )
            log.debug("%s connected", client)
            while True:
                message = await self._read(reader, self.config.idle_timeout)
                reply = self._dispatch(client, message)
                if reply is not None:
                    await self._send(client, reply)
        except asyncio.IncompleteReadError:
            log.debug("%s closed the connection", client)
        except asyncio.TimeoutError:
            log.info("dropped %s: it sent nothing, or an incomplete message, in time", client)
        except ProtocolError as exc:
            log.warning("dropped %s: %s", client, exc)
        except OSError as exc:
            log.debug("%s: connection error %s", client, exc)
        finally:
            self.connections -= 1
            self._forget(client)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), self.config.message_timeout)

    async def _read(self, reader: asyncio.StreamReader, wait_first: float) -> dict[str, Any]:
        """One frame: its first byte within ``wait_first``, the rest within the message timeout."""
        loop = asyncio.get_running_loop()
        first = await asyncio.wait_for(reader.readexactly(1), wait_first)
        deadline = loop.time() + self.config.message_timeout
        rest = await asyncio.wait_for(reader.readexactly(3), max(0.0, deadline - loop.time()))
        length = protocol.frame_length(first + rest)
        body = await asyncio.wait_for(reader.readexactly(length), max(0.0, deadline - loop.time()))
        message = protocol.decode(body)
        if not isinstance(message.get("op"), str):
            raise ProtocolError("request has no 'op'")
        return message

    async def _send(self, client: _Client, message: dict[str, Any]) -> None:
        client.writer.write(protocol.encode(message))
        await asyncio.wait_for(client.writer.drain(), self.config.message_timeout)

    async def _refuse(self, writer: asyncio.StreamWriter, problem: str) -> None:
        """Turn away a connection over the limit; ``retry``: the client may try again later."""
        with contextlib.suppress(Exception):
            refusal = {"op": "error", "ok": False, "error": problem, "retry": True}
            writer.write(protocol.encode(refusal))
            await asyncio.wait_for(writer.drain(), self.config.message_timeout)
        writer.close()

    def _push(self, client: _Client, message: dict[str, Any]) -> None:
        transport = client.writer.transport
        if transport.is_closing():
            return
        if transport.get_write_buffer_size() > MAX_PENDING_BYTES:
            log.warning("dropped %s: it does not read its wake-ups", client)
            transport.abort()
            return
        client.writer.write(protocol.encode(message))

    def _check_hello(self, hello: dict[str, Any]) -> str | None:
        if hello.get("op") != "hello":
            return f"expected hello first, got {hello.get('op')!r}"
        if hello.get("protocol") != protocol.PROTOCOL:
            return (
                f"this is a dbqueue lock server (protocol {protocol.PROTOCOL!r}), "
                f"not {hello.get('protocol')!r}"
            )
        if hello.get("version") != protocol.VERSION:
            return (
                f"protocol version {hello.get('version')!r} is not supported: this server speaks "
                f"version {protocol.VERSION} (run the same dbqueue version on both sides)"
            )
        if self.config.token is not None:
            token = hello.get("token")
            if not isinstance(token, str) or not hmac.compare_digest(
                token.encode(), self.config.token.encode()
            ):
                return (
                    "wrong token" if token else "this server requires a token"
                ) + ": set DBQUEUE_LOCK_SERVER_TOKEN to the server's token"
        return None

    # ---- requests -----------------------------------------------------------------------------
    def _dispatch(self, client: _Client, message: dict[str, Any]) -> dict[str, Any] | None:
        """Answer one request; requests without an ``id`` get no reply (fire and forget)."""
        op, request_id = message["op"], message.get("id")
        try:
            result = self._handle(client, op, message)
        except ValueError as exc:
            log.debug("%s: bad %s request: %s", client, op, exc)
            result, ok = {"error": f"bad {op} request: {exc}"}, False
        else:
            ok = True
        if request_id is None:
            return None
        return {"id": request_id, "ok": ok, **result}

    def _handle(self, client: _Client, op: str, message: dict[str, Any]) -> dict[str, Any]:
        if op in ("acquire", "release", "holding"):
            names = protocol.names_field(message)
            owner = message.get("owner", "")
            if not isinstance(owner, str) or len(owner) > protocol.MAX_NAME_CHARS:
                raise ValueError("'owner' must be a string")
            if op == "acquire":
                return {"taken": [self._acquire(client, name, owner) for name in names]}
            if op == "release":
                return {"released": sum(self._release(client, name, owner) for name in names)}
            return {"held": [self.locks.get(name) == (client, owner) for name in names]}
        if op == "subscribe":
            client.queues = set(protocol.names_field(message, "queues"))
            return {}
        if op == "hint":
            self.wake(protocol.names_field(message, "queues"))
            return {}
        if op == "ping":
            return {}
        if op == "stats":
            return {
                "server": self.server_id,
                "clients": len(self.clients),
                "locks": len(self.locks),
                "subscribers": sum(1 for c in self.clients if c.queues),
            }
        raise ValueError(f"unknown op {op!r}")

    def _acquire(self, client: _Client, name: str, owner: str) -> bool:
        if name in self.locks:  # held: by another client, or already by this one (not re-entrant)
            return False
        self.locks[name] = (client, owner)
        client.locks.add(name)
        return True

    def _release(self, client: _Client, name: str, owner: str) -> int:
        if self.locks.get(name) != (client, owner):
            return 0
        del self.locks[name]
        client.locks.discard(name)
        return 1

    def _forget(self, client: _Client) -> None:
        self.clients.discard(client)
        freed = 0
        for name in client.locks:
            holder = self.locks.get(name)
            if holder is not None and holder[0] is client:
                del self.locks[name]
                freed += 1
        client.locks.clear()
        if freed:
            log.info("%s disconnected: released its %d lock(s)", client, freed)

    # ---- wake-ups -----------------------------------------------------------------------------
    def wake(self, queues: Sequence[str]) -> int:
        """Push "work available" for ``queues`` to every client subscribed to one of them."""
        wanted = set(queues)
        sent = 0
        for client in list(self.clients):
            for queue in sorted(client.queues & wanted):
                self._push(client, {"op": "wake", "queue": queue})
                sent += 1
        return sent

    async def _poll_loop(self) -> None:
        assert self.poll is not None
        while True:
            try:
                queues = await asyncio.to_thread(self.poll)
            except Exception as exc:  # database down: keep serving locks, try again next time
                if not self._poll_failing:
                    log.warning("cannot read the queue table: %s", _first_line(exc))
                self._poll_failing = True
            else:
                if self._poll_failing:
                    log.info("reading the queue table again")
                self._poll_failing = False
                if queues:
                    log.debug(
                        "runnable jobs in %s: %d wake-up(s)", ", ".join(queues), self.wake(queues)
                    )
            await asyncio.sleep(self.config.check_interval)


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return str(Address(str(peer[0]), int(peer[1])))
    return str(peer)


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

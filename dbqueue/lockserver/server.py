"""``dbqueue server``: named locks and "work available" pushes over TCP.

One event loop, a ``Connection`` protocol per client (``connection.py``). The server keeps only
what dies with its clients — which connection holds which named lock, and which idle connection
wants wake-ups for which queues — so restarting it loses nothing: the jobs, their states and
their history stay in the database. A lock belongs to one (connection, owner) pair and is
released the moment that connection drops, which is what lets the workers' rescue routine tell
a dead worker's job from a live one.

Defences, each with its own limit: a connection must say ``hello`` within the message timeout;
every message must arrive whole within the message timeout of its first byte; a connection silent
for longer than the idle timeout (clients ping at a third of it) is dropped, and its locks with
it; a frame over the size limit, or anything that is not a frame, drops the connection; at most
``max_clients`` connections are served at once; replies a client leaves unread (over the
transport's high-water mark) for longer than the message timeout, or pushes piling up unread,
drop it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from dbqueue.lockserver import protocol
from dbqueue.lockserver.config import ServerConfig
from dbqueue.lockserver.connection import Connection
from dbqueue.lockserver.protocol import Address

log = logging.getLogger("dbqueue.lockserver")


class LockServer:
    """The protocol's state machine; ``run()`` serves it until ``stop()``.

    ``poll`` returns the queues that hold runnable jobs (it reads the database, in a thread);
    the server calls it every ``check_interval`` seconds and wakes those queues' subscribers.
    """

    def __init__(self, config: ServerConfig, poll: Callable[[], Sequence[str]] | None = None):
        self.config = config
        self.poll = poll
        self.server_id = secrets.token_hex(6)
        self.locks: dict[str, tuple[Connection, str]] = {}
        self.clients: set[Connection] = set()
        #: Every connection admitted (``clients``: those past their hello).
        self._open: set[Connection] = set()
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
                loop = asyncio.get_running_loop()
                server = await loop.create_server(lambda: Connection(self), self.config.bind, port)
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
            for connection in list(self._open):
                connection.close()
            for server in servers:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server.wait_closed(), self.config.message_timeout)

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    # ---- connections ------------------------------------------------------------------------
    def admit(self, connection: Connection) -> dict[str, Any] | None:
        """Number a new connection; or the refusal to send it when the server is full."""
        if len(self._open) >= self.config.max_clients:
            log.warning(
                "refused %s: %d clients already (MAX_CLIENT_THREADS)",
                connection.peer,
                len(self._open),
            )
            problem = (
                f"server full: it serves at most {self.config.max_clients} "
                "clients (MAX_CLIENT_THREADS)"
            )
            return {"op": "error", "ok": False, "error": problem, "retry": True}
        self._open.add(connection)
        self._numbers += 1
        connection.number = self._numbers
        return None

    def greet(self, connection: Connection, hello: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """The reply to a connection's first message, and whether it is served from now on."""
        problem = self._check_hello(hello)
        if problem is not None:
            log.warning("refused %s: %s", connection.peer, problem)
            return {"op": "error", "ok": False, "error": problem}, False
        connection.name = str(hello.get("client") or "")[:200]
        self.clients.add(connection)
        log.debug("%s connected", connection)
        reply = {
            "ok": True,
            "version": protocol.VERSION,
            "server": self.server_id,
            "idle_timeout": self.config.idle_timeout,
        }
        return reply, True

    def closed(self, connection: Connection) -> None:
        self._open.discard(connection)
        self._forget(connection)

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
    def dispatch(self, client: Connection, message: dict[str, Any]) -> dict[str, Any] | None:
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

    def _handle(self, client: Connection, op: str, message: dict[str, Any]) -> dict[str, Any]:
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

    def _acquire(self, client: Connection, name: str, owner: str) -> bool:
        if name in self.locks:  # held: by another client, or already by this one (not re-entrant)
            return False
        self.locks[name] = (client, owner)
        client.locks.add(name)
        return True

    def _release(self, client: Connection, name: str, owner: str) -> int:
        if self.locks.get(name) != (client, owner):
            return 0
        del self.locks[name]
        client.locks.discard(name)
        return 1

    def _forget(self, client: Connection) -> None:
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
                client.push({"op": "wake", "queue": queue})
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


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

"""A process's connection to the lock server: reconnects, heartbeats, replies and pushes.

One connection per server address per process, shared by the claim strategy, the wake-up
channel and enqueue hints (``connect()`` / ``disconnect()`` count the users). A background thread
connects with backoff, says hello and reads: replies go to the thread waiting for them, pushes to
the subscribers. When anything goes wrong the connection is closed — the server then frees every
lock it held — and the thread reconnects. After each (re)connect the connect hooks run first
(re-acquire the locks this process still holds, subscribe to the wanted queues, flush hints), so
that they precede every other request on the new connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dbqueue.errors import ConfigurationError, DbqueueError
from dbqueue.lockserver import protocol
from dbqueue.lockserver.protocol import Address, ProtocolError

log = logging.getLogger("dbqueue.lockserver")

MIN_BACKOFF = 0.1
MAX_BACKOFF = 5.0
#: How often the reader looks at the socket and the heartbeat clock.
_TICK = 0.25
#: What one read takes at most: many replies at once (a reply is some hundreds of bytes).
_RECV_BYTES = 256 * 1024

Send = Callable[[dict[str, Any]], None]


class LockServerUnavailableError(DbqueueError):
    """The lock server cannot be reached (yet): claims wait, the worker retries."""


class LockServerRefusedError(LockServerUnavailableError, ConfigurationError):
    """The lock server refused this client (wrong token, protocol version): fix the settings.
    Refused at start-up; later (the server restarted with another token) retried like an
    outage."""


class _Refused(Exception):
    def __init__(self, reason: str, retry: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry = retry


class _Pending:
    __slots__ = ("event", "reply", "future")

    def __init__(self, future: asyncio.Future[None] | None = None) -> None:
        self.event = threading.Event()
        self.reply: dict[str, Any] | None = None
        #: An asyncio caller's (``request_async``): resolved on its loop when the reply comes.
        self.future = future

    def done(self) -> None:
        self.event.set()
        future = self.future
        if future is not None:
            future.get_loop().call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class LockServerClient:
    """One connection to one lock server; thread-safe. Use ``connect()`` to share it."""

    def __init__(
        self, address: Address, *, token: str | None = None, timeout: float = 5.0, name: str = ""
    ) -> None:
        self.address = address
        self.token = token
        self.timeout = timeout
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.server_id: str | None = None
        self.last_error = "not connected yet"
        self.refused: str | None = None
        self.connects = 0
        self._heartbeat = protocol.DEFAULT_IDLE_TIMEOUT / 3
        self._state = threading.Lock()
        self._send_lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._connected = threading.Event()
        self._first_attempt = threading.Event()
        self._stop = threading.Event()
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._last_sent = time.monotonic()
        self._hooks: list[Callable[[Send], None]] = []
        self._subscribers: dict[int, tuple[frozenset[str], Callable[[str], None]]] = {}
        self._subscriber_ids = itertools.count(1)
        self._hints: set[str] = set()
        self._thread = threading.Thread(
            target=self._run, name=f"dbqueue-lockserver-{address}", daemon=True
        )
        self._thread.start()

    # ---- requests -----------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def connection_number(self) -> int | None:
        """Which connection is up (``connects`` counts them), None when none is. Read twice
        around the connected flag: a connection that broke and came back in between shows as
        the new number, never the old one."""
        before = self.connects
        up = self._connected.is_set()
        return before if up and self.connects == before else None

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send a request and wait for its reply (waiting up to the timeout for a connection).

        A reply that does not come in time closes the connection: this process cannot know
        what the server did with the request, and closing makes the server free every lock the
        connection held, which is the one safe way out.
        """
        return self.request_later(op, **fields)()

    def request_later(self, op: str, **fields: Any) -> Callable[[], dict[str, Any]]:
        """Send a request now; the call returned waits for its reply, as ``request`` does, so
        that the caller can do other work (a database statement) while it travels."""
        deadline = time.monotonic() + self.timeout
        if not self._connected.wait(self.timeout):
            raise self._unavailable()
        pending = _Pending()
        request_id = next(self._ids)
        with self._state:
            sock = self._sock
            self._pending[request_id] = pending
        try:
            if sock is None:
                raise self._unavailable()
            try:
                self._write(sock, {"op": op, "id": request_id, **fields})
            except (OSError, ProtocolError) as exc:
                self._broken(sock, f"sending {op} failed: {exc}")
                raise self._unavailable() from None
        except BaseException:
            with self._state:
                self._pending.pop(request_id, None)
            raise

        def reply() -> dict[str, Any]:
            try:
                if not pending.event.wait(max(0.0, deadline - time.monotonic())):
                    self._broken(sock, f"no reply to {op} within {self.timeout:g}s")
                    raise self._unavailable()
            finally:
                with self._state:
                    self._pending.pop(request_id, None)
            return self._checked(op, pending.reply)

        return reply

    async def request_async(self, op: str, **fields: Any) -> dict[str, Any]:
        """``request`` for a coroutine: the same connection and protocol, and the event loop
        goes on running while the reply travels (the reader thread resolves a future on it)."""
        deadline = time.monotonic() + self.timeout
        while not self._connected.is_set():
            if time.monotonic() >= deadline:
                raise self._unavailable()
            await asyncio.sleep(0.01)
        pending = _Pending(asyncio.get_running_loop().create_future())
        request_id = next(self._ids)
        with self._state:
            sock = self._sock
            self._pending[request_id] = pending
        try:
            if sock is None:
                raise self._unavailable()
            try:
                self._write(sock, {"op": op, "id": request_id, **fields})
            except (OSError, ProtocolError) as exc:
                self._broken(sock, f"sending {op} failed: {exc}")
                raise self._unavailable() from None
            assert pending.future is not None
            try:
                await asyncio.wait_for(pending.future, max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                self._broken(sock, f"no reply to {op} within {self.timeout:g}s")
                raise self._unavailable() from None
        finally:
            with self._state:
                self._pending.pop(request_id, None)
        return self._checked(op, pending.reply)

    def _checked(self, op: str, reply: dict[str, Any] | None) -> dict[str, Any]:
        if reply is None:
            raise self._unavailable()
        if not reply.get("ok"):
            raise DbqueueError(f"the lock server rejected {op}: {reply.get('error')}")
        return reply

    def send(self, op: str, **fields: Any) -> bool:
        """Send without waiting for a reply; False if there is no connection right now."""
        with self._state:
            sock = self._sock if self._connected.is_set() else None
        if sock is None:
            return False
        try:
            self._write(sock, {"op": op, **fields})
        except (OSError, ProtocolError) as exc:
            self._broken(sock, f"sending {op} failed: {exc}")
            return False
        return True

    def hint(self, queues: Iterable[str]) -> None:
        """Tell the server jobs were enqueued in ``queues`` (kept for the next connect if the
        connection is down); never blocks on a connection being made."""
        wanted = sorted(set(queues))
        if wanted and not self.send("hint", queues=wanted[: protocol.MAX_NAMES]):
            with self._state:
                if len(self._hints) < protocol.MAX_NAMES:
                    self._hints.update(wanted)

    def wait_connected(self, timeout: float) -> bool:
        """Wait for the first connection attempt's outcome: True if connected, False if the
        server is not reachable yet; raises LockServerRefusedError if it refused this client."""
        self._first_attempt.wait(timeout)
        if self.refused is not None and not self.connected:
            raise self._unavailable()
        return self.connected

    # ---- connect hooks and subscriptions ------------------------------------------------------
    def add_connect_hook(self, hook: Callable[[Send], None]) -> None:
        """Run ``hook(send)`` after every (re)connect, before other requests; and now, if
        connected (``send`` writes a request without waiting for its reply)."""
        with self._state:
            self._hooks.append(hook)
            sock = self._sock if self._connected.is_set() else None
            if sock is not None:
                self._run_hook(hook, sock)

    def remove_connect_hook(self, hook: Callable[[Send], None]) -> None:
        with self._state:
            if hook in self._hooks:
                self._hooks.remove(hook)

    def subscribe(self, queues: Sequence[str], on_wake: Callable[[str], None]) -> int:
        """Have ``on_wake(queue)`` called when the server pushes work for one of ``queues``."""
        with self._state:
            key = next(self._subscriber_ids)
            self._subscribers[key] = (frozenset(queues), on_wake)
            sock = self._sock if self._connected.is_set() else None
            if sock is not None:
                self._send_subscription(sock)
        return key

    def unsubscribe(self, key: int) -> None:
        with self._state:
            if self._subscribers.pop(key, None) is None:
                return
            sock = self._sock if self._connected.is_set() else None
            if sock is not None:
                self._send_subscription(sock)

    def close(self) -> None:
        self._stop.set()
        with self._state:
            sock = self._sock
        if sock is not None:
            self._broken(sock, "closed")
        self._thread.join(self.timeout + 1)

    # ---- the connection thread ----------------------------------------------------------------
    def _run(self) -> None:
        backoff = MIN_BACKOFF
        reported = False  # one warning per outage, not one per attempt
        while not self._stop.is_set():
            try:
                sock = self._open()
            except _Refused as exc:
                if not exc.retry and self.refused != exc.reason:
                    log.error(
                        "the lock server at %s refused this client: %s", self.address, exc.reason
                    )
                    self.refused = exc.reason
                self.last_error = exc.reason
            except (OSError, ProtocolError) as exc:
                self.last_error = str(exc) or type(exc).__name__
                if not reported:
                    log.warning(
                        "cannot reach the lock server at %s (%s); retrying with backoff",
                        self.address,
                        self.last_error,
                    )
                    reported = True
            else:
                backoff = MIN_BACKOFF
                reported = False
                self.refused = None
                self._serve(sock)
                continue
            self._first_attempt.set()
            self._stop.wait(backoff)
            backoff = min(MAX_BACKOFF, backoff * 2)

    def _open(self) -> socket.socket:
        sock = socket.create_connection((self.address.host, self.address.port), self.timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.settimeout(self.timeout)
            hello = {
                "op": "hello",
                "protocol": protocol.PROTOCOL,
                "version": protocol.VERSION,
                "client": self.name,
            }
            if self.token:
                hello["token"] = self.token
            sock.sendall(protocol.encode(hello))
            reply = _read_frame(sock, time.monotonic() + self.timeout)
            if not reply.get("ok"):
                raise _Refused(str(reply.get("error") or "refused"), bool(reply.get("retry")))
        except BaseException:
            sock.close()
            raise
        idle = reply.get("idle_timeout")
        if isinstance(idle, (int, float)) and idle > 0:
            self._heartbeat = max(0.2, idle / 3)
        previous, self.server_id = self.server_id, str(reply.get("server"))
        if previous is not None and previous != self.server_id:
            log.warning(
                "the lock server at %s restarted: re-acquiring this process's locks", self.address
            )
        return sock

    def _serve(self, sock: socket.socket) -> None:
        with self._state:
            self._sock = sock
            self._last_sent = time.monotonic()
            for hook in self._hooks:
                self._run_hook(hook, sock)
            if self._subscribers:
                self._send_subscription(sock)
            if self._hints:
                hints, self._hints = sorted(self._hints), set()
                self._write_quietly(sock, {"op": "hint", "queues": hints})
            self.connects += 1
            self.last_error = "connected"
            self._connected.set()
        self._first_attempt.set()
        log.info(
            "%s the lock server at %s",
            "reconnected to" if self.connects > 1 else "connected to",
            self.address,
        )
        reason = "closed"
        try:
            self._read_loop(sock)
        except (OSError, ProtocolError, ValueError) as exc:  # ValueError: closed under select
            reason = str(exc) or type(exc).__name__
        self._broken(sock, reason)
        if not self._stop.is_set():
            log.warning("lost the lock server at %s (%s); reconnecting", self.address, reason)

    def _read_loop(self, sock: socket.socket) -> None:
        """Read whatever has arrived into one buffer and dispatch its whole frames; a frame
        begun must be whole within the timeout."""
        ping_sent: float | None = None
        buffer = bytearray()
        partial_since: float | None = None
        while not self._stop.is_set() and self._sock is sock:
            readable, _, _ = select.select([sock], [], [], _TICK)
            now = time.monotonic()
            if readable:
                chunk = sock.recv(_RECV_BYTES)
                if not chunk:
                    raise ConnectionError("the lock server closed the connection")
                buffer += chunk
                for message in protocol.take_frames(buffer):
                    ping_sent = None
                    self._dispatch(message)
                partial_since = (partial_since or now) if buffer else None
                continue
            if partial_since is not None and now - partial_since > self.timeout:
                raise TimeoutError("incomplete message from the lock server")
            if ping_sent is not None and now - ping_sent > self.timeout:
                raise TimeoutError(f"no answer to a ping within {self.timeout:g}s")
            if ping_sent is None and now - self._last_sent >= self._heartbeat:
                self._write(sock, {"op": "ping", "id": 0})
                ping_sent = now

    def _dispatch(self, message: dict[str, Any]) -> None:
        if message.get("op") == "wake":
            queue = message.get("queue")
            with self._state:
                targets = [cb for queues, cb in self._subscribers.values() if queue in queues]
            for on_wake in targets:
                try:
                    on_wake(str(queue))
                except Exception:  # a subscriber's bug must not kill the connection
                    log.exception("wake-up callback failed")
            return
        request_id = message.get("id")
        with self._state:  # popped: a reply nobody waits for any more leaves nothing behind
            pending = self._pending.pop(request_id, None) if isinstance(request_id, int) else None
        if pending is not None:
            pending.reply = message
            pending.done()

    def _broken(self, sock: socket.socket, reason: str) -> None:
        """Close ``sock`` and fail the requests waiting on it (idempotent)."""
        with self._state:
            if self._sock is sock:
                self._sock = None
                self._connected.clear()
                self.last_error = reason
                waiting = list(self._pending.values())
            else:
                waiting = []
        for pending in waiting:
            pending.done()
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    # ---- writing ------------------------------------------------------------------------------
    def _write(self, sock: socket.socket, message: dict[str, Any]) -> None:
        data = protocol.encode(message)
        with self._send_lock:
            sock.sendall(data)
            self._last_sent = time.monotonic()

    def _write_quietly(self, sock: socket.socket, message: dict[str, Any]) -> None:
        """For connect hooks: a failure shows up as a broken connection in the reader."""
        try:
            self._write(sock, message)
        except (OSError, ProtocolError) as exc:
            log.debug("writing %s failed: %s", message.get("op"), exc)

    def _run_hook(self, hook: Callable[[Send], None], sock: socket.socket) -> None:
        try:
            hook(lambda message: self._write_quietly(sock, message))
        except Exception:  # a hook's bug must not stop the connection
            log.exception("lock server connect hook failed")

    def _send_subscription(self, sock: socket.socket) -> None:
        queues = sorted(set().union(*(q for q, _ in self._subscribers.values())))
        self._write_quietly(sock, {"op": "subscribe", "queues": queues[: protocol.MAX_NAMES]})

    def _unavailable(self) -> DbqueueError:
        if self.refused is not None:
            return LockServerRefusedError(
                f"the lock server at {self.address} refused this client: {self.refused}"
            )
        return LockServerUnavailableError(
            f"cannot reach the lock server at {self.address} ({self.last_error}): start "
            "`dbqueue server` there, or fix --server / DBQUEUE_LOCK_SERVER"
        )


def _read_frame(sock: socket.socket, deadline: float) -> dict[str, Any]:
    header = _recv_exactly(sock, protocol.HEADER.size, deadline)
    return protocol.decode(_recv_exactly(sock, protocol.frame_length(header), deadline))


def _recv_exactly(sock: socket.socket, size: int, deadline: float) -> bytes:
    """Read ``size`` bytes by ``deadline``, waiting with select() so that the socket's own
    timeout (which concurrent writers rely on) is never changed."""
    chunks = bytearray()
    while len(chunks) < size:
        remaining = deadline - time.monotonic()
        readable = select.select([sock], [], [], remaining)[0] if remaining > 0 else []
        if not readable:
            raise TimeoutError("incomplete message from the lock server")
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("the lock server closed the connection")
        chunks += chunk
    return bytes(chunks)


# ---- sharing one connection per address in a process ---------------------------------------
_shared: dict[tuple[Any, ...], list[Any]] = {}
_shared_lock = threading.Lock()


def connect(
    address: Address, *, token: str | None, timeout: float, name: str = ""
) -> LockServerClient:
    """This process's connection to ``address`` (created on first use); pair with
    ``disconnect()``. Keyed by process id too, so that a forked child opens its own."""
    key = (os.getpid(), address, token, timeout)
    with _shared_lock:
        entry = _shared.get(key)
        if entry is None:
            entry = _shared[key] = [
                LockServerClient(address, token=token, timeout=timeout, name=name),
                0,
            ]
        entry[1] += 1
        return entry[0]


def disconnect(client: LockServerClient) -> None:
    with _shared_lock:
        for key, entry in list(_shared.items()):
            if entry[0] is client:
                entry[1] -= 1
                if entry[1] > 0:
                    return
                del _shared[key]
                break
        else:
            return
    client.close()

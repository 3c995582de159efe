"""One client connection of ``dbqueue server``: frames in, replies out, and its deadlines.

An asyncio Protocol, not a stream task: each request is parsed and answered in the callback
that received its bytes, with no task, future or timeout object per message. (Reading frames
from a stream under ``wait_for`` cost about 220 µs of server CPU a message, ten times the
locks' own work, and the lock_server strategy sends three messages a batch.) One timer per
connection watches all of its deadlines; it moves only when it fires, or when an earlier
deadline appears.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol, cast

from dbqueue.lockserver import protocol
from dbqueue.lockserver.config import ServerConfig
from dbqueue.lockserver.protocol import Address, ProtocolError

log = logging.getLogger("dbqueue.lockserver")

#: Unread pushes a client may accumulate before the server gives up on it.
MAX_PENDING_BYTES = 256 * 1024


class ConnectionHost(Protocol):
    """What a connection asks of the server that accepted it (``server.LockServer``): declared
    here, so that the connection needs nothing of the server's module."""

    config: ServerConfig

    def admit(self, connection: Connection) -> dict[str, Any] | None: ...

    def greet(
        self, connection: Connection, hello: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]: ...

    def dispatch(self, client: Connection, message: dict[str, Any]) -> dict[str, Any] | None: ...

    def closed(self, connection: Connection) -> None: ...


class Connection(asyncio.Protocol):
    """A client's connection: its locks and subscriptions, and the defences against a bad client
    (see ``server.py``). The server's state machine answers its messages."""

    def __init__(self, server: ConnectionHost) -> None:
        self.server = server
        self.number = 0
        self.peer = "?"
        self.name = ""
        self.locks: set[str] = set()
        self.queues: set[str] = set()
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self._greeted = False
        self._closing = False
        self._opened_at = self._last_read = self._loop.time()
        #: When the incomplete frame in the buffer began, and when writing was paused (the
        #: client does not read): each must end within the message timeout.
        self._partial_since: float | None = None
        self._paused_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    def __str__(self) -> str:
        return f"client {self.number} ({self.name or '?'} from {self.peer})"

    # ---- asyncio callbacks --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.peer = _peer(self.transport)
        refusal = self.server.admit(self)
        if refusal is not None:
            self._write(refusal)
            self.close()
            return
        self._arm(self._opened_at + self.server.config.message_timeout)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        now = self._last_read = self._loop.time()
        buffer = self._buffer
        buffer += data
        answered = False
        try:
            for message in protocol.take_frames(buffer):
                if not isinstance(message.get("op"), str):
                    raise ProtocolError("request has no 'op'")
                answered = True
                self._answer(message)
                if self._closing:
                    return
        except ProtocolError as exc:
            log.warning("dropped %s: %s", self, exc)
            self.close()
            return
        if not buffer:
            self._partial_since = None
        elif answered or self._partial_since is None:
            self._partial_since = now
            self._arm(now + self.server.config.message_timeout)

    def pause_writing(self) -> None:
        """The client does not read: stop reading its requests until it does."""
        self._paused_since = self._loop.time()
        if self.transport is not None:
            self.transport.pause_reading()
        self._arm(self._paused_since + self.server.config.message_timeout)

    def resume_writing(self) -> None:
        self._paused_since = None
        self._last_read = self._loop.time()  # the idle clock, stopped while not reading
        if self._partial_since is not None:
            self._partial_since = self._last_read
        if self.transport is not None and not self._closing:
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.debug("%s: connection error %s", self, exc)
        else:
            log.debug("%s closed the connection", self)
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.server.closed(self)

    # ---- messages -----------------------------------------------------------------------------
    def _answer(self, message: dict[str, Any]) -> None:
        if self._greeted:
            reply = self.server.dispatch(self, message)
            if reply is not None:
                self._write(reply)
            return
        reply, accepted = self.server.greet(self, message)
        self._write(reply)
        if accepted:
            self._greeted = True
        else:
            self.close()

    def _write(self, message: dict[str, Any]) -> None:
        if self.transport is not None:
            self.transport.write(protocol.encode(message))

    def push(self, message: dict[str, Any]) -> None:
        """A push (``wake``) nobody waits for: a client that lets them pile up is dropped."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if transport.get_write_buffer_size() > MAX_PENDING_BYTES:
            log.warning("dropped %s: it does not read its wake-ups", self)
            self.abort()
            return
        transport.write(protocol.encode(message))

    def close(self) -> None:
        """Send what is buffered, then close."""
        self._closing = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close at once, dropping what is buffered (a client that does not read)."""
        self._closing = True
        if self.transport is not None:
            self.transport.abort()

    # ---- deadlines ----------------------------------------------------------------------------
    def _arm(self, when: float) -> None:
        """Have the timer fire by ``when`` (earlier if it already would)."""
        if self._closing:
            return
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._check)

    def _check(self) -> None:
        self._timer = None
        if self._closing:
            return
        due, why = self._deadline()
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._check)
            return
        log.info("dropped %s: %s", self, why)
        self.abort()

    def _deadline(self) -> tuple[float, str]:
        """The earliest deadline now running, and what missing it means. While the server
        does not read (the client does not read its replies), only that one runs."""
        config = self.server.config
        if self._paused_since is not None:
            return self._paused_since + config.message_timeout, "it does not read its replies"
        if self._greeted:
            deadline = self._last_read + config.idle_timeout, f"silent for {config.idle_timeout:g}s"
        else:
            deadline = self._opened_at + config.message_timeout, "it sent no hello in time"
        if self._partial_since is not None:
            deadline = min(
                deadline, (self._partial_since + config.message_timeout, "an incomplete message")
            )
        return deadline


def _peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return str(Address(str(peer[0]), int(peer[1])))
    return str(peer)

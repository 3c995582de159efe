"""The lock server's wire protocol, shared by ``dbqueue server`` and its clients.

Every message is a frame: a 4-byte big-endian length, then that many bytes of UTF-8 JSON holding
one object with an ``op``. A connection starts with the client's ``hello`` (protocol name,
version, optional token); anything else, a frame over ``MAX_FRAME_BYTES`` or bytes that are not
such a frame, and the server drops the connection. Requests carry an ``id`` that the reply
echoes; the server's pushes (``wake``) have none. The length prefix lets the server refuse an
oversized message from its header alone, without reading the body.

Requests (client → server) and their replies:

    hello      {protocol, version, token?, client}  → {ok, version, server, idle_timeout}
    acquire    {names, owner}                       → {taken: [bool, …]}   never waits
    release    {names, owner}                       → {released: n}
    holding    {names, owner}                       → {held: [bool, …]}
    subscribe  {queues}                             → {}    wake-ups wanted for these queues
    hint       {queues}                             → {}    "I just enqueued here": wake them
    ping       {}                                   → {}    keeps an idle connection alive
    stats      {}                                   → {clients, locks, subscribers, server}

Pushes (server → client): ``{"op": "wake", "queue": name}``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dbqueue.errors import ConfigurationError

try:  # the `fast` extra: a lock request's frame in a tenth of json's time, on both ends
    import orjson
except ImportError:  # pragma: no cover - exercised by forcing the fallback in the tests
    orjson = None  # type: ignore[assignment]

PROTOCOL = "dbqueue-lockserver"
VERSION = 1
#: A request names at most MAX_NAMES locks of at most MAX_NAME_CHARS each: 64 KiB is ample, and
#: small enough that a client cannot make the server buffer much.
MAX_FRAME_BYTES = 64 * 1024
MAX_NAMES = 500
MAX_NAME_CHARS = 200
HEADER = struct.Struct("!I")

DEFAULT_LOCK_PORT = 8970  # the seed's LOCK_SERVICE_PORT
DEFAULT_NOTIFY_PORT = 8770  # the seed's NOTIFY_SERVICE_PORT
DEFAULT_MESSAGE_TIMEOUT = 5.0  # TIMEOUT_SOCKET_MESSAGE
DEFAULT_IDLE_TIMEOUT = 30.0  # LOCK_SERVICE_WAIT_CONN_INTERVAL


class ProtocolError(Exception):
    """A peer sent something that is not a valid frame of this protocol."""


def _dumps(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def _loads(body: bytes) -> Any:
    return json.loads(body)


#: Either end may have orjson or not: both write plain JSON (orjson leaves non-ASCII unescaped,
#: which json reads the same), and both raise ValueError on what is not JSON or not UTF-8.
_DUMPS: Any = orjson.dumps if orjson is not None else _dumps
_LOADS: Any = orjson.loads if orjson is not None else _loads


def encode(message: dict[str, Any]) -> bytes:
    try:
        body = _DUMPS(message)
    except TypeError as exc:  # orjson's JSONEncodeError, json's own: a bug, said plainly
        raise ProtocolError(f"message cannot be written as JSON: {exc}") from None
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(f"message of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return HEADER.pack(len(body)) + body


def frame_length(header: bytes | bytearray) -> int:
    """The body length announced by the header at the start of ``header``; refuses one over the
    limit before it is read."""
    (length,) = HEADER.unpack_from(header)
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"announced a message of {length} bytes (limit {MAX_FRAME_BYTES})")
    return length


def take_frames(buffer: bytearray) -> Iterator[dict[str, Any]]:
    """The whole frames at the start of ``buffer``, each removed as it is yielded; an incomplete
    one is left. Read into one buffer, a burst of replies costs one ``recv``, not two each."""
    size = HEADER.size
    while len(buffer) >= size:
        end = size + frame_length(buffer)
        if len(buffer) < end:
            return
        body = bytes(buffer[size:end])
        del buffer[:end]
        yield decode(body)


def decode(body: bytes) -> dict[str, Any]:
    try:
        message = _LOADS(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"message is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("message is not a JSON object")
    return message


def names_field(message: dict[str, Any], field: str = "names") -> list[str]:
    """A request's list of lock (or queue) names, checked: raises ValueError naming the fault."""
    names = message.get(field)
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"'{field}' must be a list of non-empty strings")
    if len(names) > MAX_NAMES:
        raise ValueError(f"'{field}' has {len(names)} entries; the limit is {MAX_NAMES}")
    if any(len(n) > MAX_NAME_CHARS for n in names):
        raise ValueError(f"'{field}' has an entry longer than {MAX_NAME_CHARS} characters")
    return names


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(text: str, default_port: int = DEFAULT_LOCK_PORT) -> Address:
    """``HOST:PORT``, ``[IPv6]:PORT`` or ``HOST`` (default port) → Address, or a clear error."""
    value = (text or "").strip()
    host, port_text, ok = value, str(default_port), True
    if value.startswith("["):
        host, closed, rest = value[1:].partition("]")
        ok = bool(closed) and (rest == "" or rest.startswith(":"))
        port_text = rest[1:] if rest else port_text
    elif ":" in value:
        host, _, port_text = value.rpartition(":")
        ok = ":" not in host  # an IPv6 address needs brackets: [::1]:8970
    port = int(port_text) if port_text.isdigit() else -1
    if not ok or not host or not 0 < port < 65536:
        raise ConfigurationError(
            f"lock server address {text!r} is not HOST:PORT: use e.g. 127.0.0.1:{default_port} "
            f"or [::1]:{default_port} (--server or DBQUEUE_LOCK_SERVER)"
        )
    return Address(host, port)

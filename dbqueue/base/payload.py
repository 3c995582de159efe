"""Payload encoding: validated once at enqueue, hashed for equivalence, decoded leniently."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from dbqueue.errors import PayloadError
from dbqueue.job import MalformedPayload

try:  # the `fast` extra: the same canonical text, several times faster to produce
    import orjson
except ImportError:  # pragma: no cover - exercised by forcing the fallback in the tests
    orjson = None  # type: ignore[assignment]

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024


class EncodedPayload(str):
    """A payload already turned into canonical JSON text (so it is encoded and hashed once)."""

    __slots__ = ()


#: One encoder for every payload (``json.dumps`` with options builds a new one per call).
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


_SCAN = json.JSONDecoder().scan_once

if orjson is not None:
    _DUMPS, _LOADS = orjson.dumps, orjson.loads
    #: Sorted keys; str/int/dict/list subclasses, datetimes and dataclasses are not orjson's to
    #: encode (it would, where json refuses or writes them differently): they fall back.
    _ORJSON_OPTIONS = (
        orjson.OPT_SORT_KEYS
        | orjson.OPT_PASSTHROUGH_SUBCLASS
        | orjson.OPT_PASSTHROUGH_DATETIME
        | orjson.OPT_PASSTHROUGH_DATACLASS
    )
else:  # pragma: no cover
    _DUMPS = _LOADS = None


#: Value types orjson writes exactly as json does (exact types: no subclass, no float): a
#: dict of only these needs none of the checks below (orjson raises on what json would not
#: write the same: non-string keys, lone surrogates, integers over 64 bits).
_FLAT = frozenset((str, int, bool, type(None)))


def canonical_text(payload: Any) -> str:
    """The canonical JSON text of ``payload``, exactly as ``_CANONICAL`` writes it (or its
    TypeError/ValueError). orjson writes the same text for strings (every code point, every
    escape), integers, booleans, null, lists and dicts with sorted keys, several times faster;
    its output is used only where it is provably the same (a flat dict of strings, integers,
    booleans and nulls at once, else after these checks):
    - anything orjson refuses (integers over 64 bits, non-string keys, subclasses, lone
      surrogates, deep nesting, cycles) goes to json, which writes it or raises as before;
    - floats below 1e-4 in magnitude are written differently (``0.00001`` and ``1e-7`` against
      json's ``1e-05`` and ``1e-07``): output with an exponent or ``0.0000`` goes to json
      (strings containing them only cost the second encoding);
    - values json refuses but orjson writes (NaN and infinity as null, UUIDs, enums) do not
      read back equal to the payload: they go to json, which refuses them.
    """
    out = _orjson_canonical(payload)
    return out.decode() if out is not None else _CANONICAL.encode(payload)


def _orjson_canonical(payload: Any) -> bytes | None:
    """orjson's UTF-8 output for ``payload`` where it is provably the canonical text
    (``canonical_text`` says when), else None."""
    if _DUMPS is None:
        return None
    try:
        out: bytes = _DUMPS(payload, option=_ORJSON_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError
        return None
    if (type(payload) is dict and _FLAT.issuperset(map(type, payload.values()))) or (
        b"e-" not in out and b"e+" not in out and b"0.0000" not in out and _LOADS(out) == payload
    ):
        return out
    return None


def encode(payload: Any, max_bytes: int | None = DEFAULT_MAX_PAYLOAD_BYTES) -> EncodedPayload:
    """Canonical JSON (sorted keys, no spaces): equal payloads hash equal whatever their key order.

    Refuses, with the path of the bad value, anything json cannot represent exactly — so a job
    never fails later because its payload could not be read back.
    """
    if isinstance(payload, EncodedPayload):
        text = payload
    else:
        try:
            text = canonical_text(payload)
        except (TypeError, ValueError) as exc:
            raise PayloadError(
                f"payload is not JSON-serialisable ({exc}{_locate(payload)}): pass only dicts, "
                "lists, strings, numbers, booleans and None (convert dates to ISO strings, "
                "Decimals to str, objects to dicts)."
            ) from None
    size = size_over(text, max_bytes)
    if size is not None:
        raise PayloadError(
            f"payload is {size} bytes, over the limit of {max_bytes} bytes: store large data "
            "in your own table and enqueue its key, or raise max_payload_bytes on the App."
        )
    return EncodedPayload(text)


def size_over(text: str, max_bytes: int | None) -> int | None:
    """The UTF-8 size of ``text`` if it is over ``max_bytes`` (None: within, or no limit).
    A code point is at most 4 bytes: only a text that could be over is measured."""
    if max_bytes is None or len(text) * 4 <= max_bytes:
        return None
    size = len(text.encode("utf-8"))
    return size if size > max_bytes else None


#: Copied for each hash: cheaper than a new object (OpenSSL 3 looks the digest up per new()).
_SHA256 = hashlib.sha256()


def payload_hash(encoded: str) -> str:
    digest = _SHA256.copy()
    digest.update(encoded.encode("utf-8"))
    return digest.hexdigest()


def encode_and_hash(payload: Any, max_bytes: int | None) -> tuple[EncodedPayload, str]:
    """``encode(payload, max_bytes)`` and its ``payload_hash``, the same pair. Where orjson's
    output is the canonical text, it is hashed and sized as it is (the text's UTF-8): no second
    encoding, a fifth of a bulk enqueue's row making. The rest (json's text, a payload over the
    limit, an error) goes through ``encode``."""
    if not isinstance(payload, EncodedPayload):
        out = _orjson_canonical(payload)
        if out is not None and (max_bytes is None or len(out) <= max_bytes):
            digest = _SHA256.copy()
            digest.update(out)
            return EncodedPayload(out.decode()), digest.hexdigest()
    text = encode(payload, max_bytes)
    return text, payload_hash(text)


def decode(value: Any) -> Any:
    """Stored JSON text to Python; a malformed value becomes a MalformedPayload, never an error."""
    if value is None or not isinstance(value, (str, bytes)):
        return value
    try:
        if type(value) is str:  # canonical text: the scanner alone, without json.loads' wrappers
            try:
                found, end = _SCAN(value, 0)
            except StopIteration:
                found, end = None, -1
            if end == len(value):
                return found
        return json.loads(value)  # anything else, and the error message for what is not JSON
    except ValueError as exc:
        return MalformedPayload(value, f"stored payload is not valid JSON: {exc}")


def _locate(value: Any, path: str = "payload") -> str:
    """Find the first value json cannot encode, to name it in the error message."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                return f" at {path}: key {key!r} of type {type(key).__name__}"
            found = _locate(item, f"{path}[{key!r}]")
            if found:
                return found
        return ""
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _locate(item, f"{path}[{index}]")
            if found:
                return found
        return ""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return f" at {path}: {value!r} is not valid JSON"
    if value is None or isinstance(value, (str, int, float, bool)):
        return ""
    return f" at {path}: value of type {type(value).__name__}"

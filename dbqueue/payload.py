"""Payload encoding: validated once at enqueue, hashed for equivalence, decoded leniently."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .errors import PayloadError
from .job import MalformedPayload

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024


class EncodedPayload(str):
    """A payload already turned into canonical JSON text (so it is encoded and hashed once)."""

    __slots__ = ()


#: One encoder for every payload (``json.dumps`` with options builds a new one per call).
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


_SCAN = json.JSONDecoder().scan_once


def encode(payload: Any, max_bytes: int | None = DEFAULT_MAX_PAYLOAD_BYTES) -> EncodedPayload:
    """Canonical JSON (sorted keys, no spaces): equal payloads hash equal whatever their key order.

    Refuses, with the path of the bad value, anything json cannot represent exactly — so a job
    never fails later because its payload could not be read back.
    """
    if isinstance(payload, EncodedPayload):
        text = payload
    else:
        try:
            text = _CANONICAL.encode(payload)
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


def payload_hash(encoded: str) -> str:
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


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

"""Handlers' results, and how a caller waiting for one learns that a job finished.

A handler's return value is stored as JSON in the job's ``result`` column, encoded once by the
payload's canonical encoder; a value JSON cannot represent fails the attempt (``encode_result``).
A handler that returns ``Message("…")`` records that text in ``message`` instead (the webhook
handler and the seed's ``WorkerBase`` do: their outcome is a line for people, not a value).

A caller of ``app.call`` marks its job ``awaited``. Only the end of such a job is announced —
by PostgreSQL's NOTIFY on the jobs table's channel (``finished_notice``) and through the lock
server (``finished_name``) — so a job nobody waits for costs the worker nothing for it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from dbqueue.base.payload import EncodedPayload, _locate, encode, size_over
from dbqueue.errors import AttemptFailed, PayloadError


class Message(str):
    """Returned by a handler: record this text as the job's ``message``, and no result."""

    __slots__ = ()


def encode_result(value: Any, max_bytes: int | None) -> EncodedPayload | Message:
    """A handler's return value as it is stored: canonical JSON text (an ``EncodedPayload``), or
    the ``Message`` it is. Raises AttemptFailed, saying what to return instead, for a value
    JSON cannot represent or one over the size limit (the payload's)."""
    if isinstance(value, Message):
        return value
    try:
        text = encode(value, max_bytes=None)
    except PayloadError:
        raise AttemptFailed(
            f"the handler returned {_describe(value)}, which JSON cannot represent: return a "
            "list, dict, str, number, bool or None (convert sets to lists, dates to ISO "
            "strings, Decimals to str, objects to dicts)"
        ) from None
    size = size_over(text, max_bytes)
    if size is not None:
        raise AttemptFailed(
            f"the handler's result is {size} bytes, over the limit of {max_bytes} bytes "
            "(max_payload_bytes, which results share with payloads): store large results "
            "in your own table and return their key"
        )
    return text


def _describe(value: Any) -> str:
    kind = type(value).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    if isinstance(value, (dict, list, tuple)):
        where = _locate(value, "result").removeprefix(" at ")
        return f"{article} {kind} ({where})" if where else f"{article} {kind}"
    return f"{article} {kind} ({_short_repr(value)})"


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- announcing that awaited jobs finished -------------------------------------------------
_NOTICE = "finished"


def finished_notice(job_ids: Iterable[int]) -> str:
    """A NOTIFY payload on the jobs table's channel saying these jobs finished. It contains a
    space, which no queue name can (the insert trigger's payloads are queue names)."""
    return " ".join([_NOTICE, *map(str, job_ids)])


def finished_ids(payload: str) -> list[int] | None:
    """The job ids of a ``finished_notice``; None for any other payload (a queue's name)."""
    head, _, rest = payload.partition(" ")
    if head != _NOTICE or not rest:
        return None
    return [int(word) for word in rest.split() if word.isdigit()]


def finished_name(channel: str, job_id: int) -> str:
    """The lock server "queue" a caller subscribes to for one job's end (spaces: never a real
    queue's name, which the server's own poll could wake)."""
    return f"{_NOTICE} {channel} {job_id}"


# ---- the threads that run handlers ---------------------------------------------------------
_local = threading.local()


@contextmanager
def running_handlers() -> Iterator[None]:
    """Mark this thread as one that runs handlers (a worker thread) while the block runs: a
    handler that calls ``app.call`` there is refused, as it would wait on itself."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth


def in_handler_thread() -> bool:
    return getattr(_local, "depth", 0) > 0

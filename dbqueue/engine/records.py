"""The values that cross the engine's interface: a job to insert, what a failure did, a queue's
counts, and the length limit every stored message obeys."""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from dbqueue.base import payload as payload_codec
from dbqueue.schema.tables import MAX_MESSAGE_CHARS


def truncate(message: str | None) -> str | None:
    if message is None or len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - 20] + "\n…[truncated]"


@dataclass(slots=True)
class NewJob:
    """One job to insert; built and validated by the client API."""

    task: str
    payload: payload_codec.EncodedPayload | None
    queue: str
    priority: int
    max_attempts: int
    delay: float | None = None
    run_at: dt.datetime | None = None
    external_key: str | None = None
    origin: str | None = None
    destination: str | None = None
    tenant: int | None = None
    business_group: str | None = None
    publication_id: int | None = None
    subscription_id: str | None = None
    dead: bool = False
    live_id: int | None = None
    #: A caller waits for the job's end (``app.call``): the worker announces it.
    awaited: bool = False
    #: Unique among the queue's unfinished jobs (``enqueue(..., unique_key=…)``).
    unique_key: str | None = None
    #: What an enqueue does when an unfinished job holds ``unique_key`` (not a column).
    on_conflict: str | None = None
    #: A coalescing task's payloads, merged: JSON ``[[score, payload], …]`` by score.
    scored_payloads: payload_codec.EncodedPayload | None = None
    #: Jobs of the queue sharing a key never run at once (see engine/keys.py).
    key: str | None = None
    #: The enqueuer's W3C trace context (set by dbqueue.tracing, else None: not sent).
    traceparent: str | None = None

    def values(self) -> dict[str, Any]:
        """Column values: the always-set columns and the optional ones this job sets."""
        payload = self.payload
        row = {
            "task": self.task,
            "queue": self.queue,
            "payload": payload,
            "payload_hash": None if payload is None else payload_codec.payload_hash(payload),
            "priority": self.priority,
            "max_attempts": self.max_attempts,
        }
        optional = _optional_values(self)
        if optional != _NONE_SET:  # one comparison for the common job, which sets none
            for name, value in zip(_OPTIONAL, optional, strict=True):
                if value is not None and value is not False:
                    row[name] = value
        return row

    @property
    def timing(self) -> str:
        """How run_at is set: by the server default, from a delay, or to an explicit time."""
        if self.run_at is not None:
            return "run_at"
        return "delay" if self.delay else "now"


# Columns every insert sets; the optional ones (every other field but the delay and
# on_conflict, which are not columns) are sent only when a job sets them, the others keep their
# server defaults: that keeps bulk inserts small, as most jobs set none of them.
ALWAYS = ("task", "queue", "payload", "payload_hash", "priority", "max_attempts")
_OPTIONAL = tuple(
    field.name
    for field in fields(NewJob)
    if field.name not in ALWAYS and field.name not in ("delay", "on_conflict")
)
_optional_values = operator.attrgetter(*_OPTIONAL)
#: The optional columns of a job that sets none of them.
_NONE_SET = tuple(False if name in ("dead", "awaited") else None for name in _OPTIONAL)


def flat_values(jobs: Sequence[NewJob]) -> list[Any] | None:
    """The ALWAYS columns of every job, row after row in one list; None when some job sets an
    optional column (then each needs ``values()``). A bulk enqueue's rows without a dict each."""
    flat: list[Any] = []
    extend = flat.extend
    hash_of = payload_codec.payload_hash
    for job in jobs:
        if _optional_values(job) != _NONE_SET:
            return None
        payload = job.payload
        extend(
            (
                job.task,
                job.queue,
                payload,
                None if payload is None else hash_of(payload),
                job.priority,
                job.max_attempts,
            )
        )
    return flat


def new_jobs(flat: list[Any]) -> list[NewJob]:
    """The jobs of a ``flat_values`` list (the inverse: jobs that set only the ALWAYS columns)."""
    rows = zip(*[iter(flat)] * len(ALWAYS), strict=True)
    return [
        NewJob(task, payload, queue, priority, attempts)
        for task, queue, payload, _, priority, attempts in rows
    ]


@dataclass(frozen=True)
class FailResult:
    """What ``fail()`` did: rows changed (0 if the job was no longer ours), dead-letter job id."""

    changed: int
    dead_letter_id: int | None = None


@dataclass(frozen=True)
class QueueStats:
    """One queue's rows: ``counts`` per stored status; ``scheduled``: available rows whose
    run_at is ahead; ``in_flight``: available rows that live workers run in their claim's open
    transaction; ``oldest_runnable_age``: seconds the oldest job that waits to run (runnable,
    not running) has waited."""

    queue: str
    counts: dict[str, int]
    scheduled: int
    oldest_runnable_age: float | None
    in_flight: int = 0

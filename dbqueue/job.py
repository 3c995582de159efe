"""The job as handlers see it, and the statuses a job row moves through."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar


class Status:
    """Values of the ``status`` column.

    One status, ``available``, covers every job waiting to run: whether it is runnable now or
    scheduled (``run_at`` in the future, after a delay or a failed attempt) is read from
    ``run_at``. Keeping a single waiting status lets the claim query read one contiguous range of
    the claim index on every database (MySQL's locking reads lock every row they scan, so an
    ``IN`` over several statuses followed by a sort would lock far more than it claims).
    """

    AVAILABLE = "available"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"

    ALL = (AVAILABLE, RUNNING, SUCCEEDED, DEAD, CANCELLED)
    FINISHED = (SUCCEEDED, DEAD, CANCELLED)
    PENDING = (AVAILABLE, RUNNING)

    # What the previous_status column records about a failed attempt.
    FAILED = "failed"


class MalformedPayload:
    """Stands in for a payload whose stored JSON cannot be decoded (a row written by hand).

    The job is still claimed, then failed with this explanation, instead of crashing the worker.
    """

    __slots__ = ("raw", "error")

    def __init__(self, raw: Any, error: str) -> None:
        self.raw = raw
        self.error = error

    def __repr__(self) -> str:
        return f"MalformedPayload({self.raw!r}: {self.error})"


# The seed (nsj-queue-lib) handed handlers a dict with Portuguese keys; Job answers those too.
_SEED_KEYS = {
    "processo": "task",
    "chave_externa": "external_key",
    "origem": "origin",
    "destino": "destination",
    "grupo_empresarial": "business_group",
    "tentativa": "attempt",
    "prioridade": "priority",
    "data_hora": "run_at",
    "data_hora_inicial": "first_attempt_at",
    "mensagem": "message",
    "subscriber_id": "subscription_id",
}


class SeedKeys:
    """``obj["key"]`` and ``obj.get("key")`` for code written against the seed's dicts: its
    Portuguese keys (``seed_keys``) are mapped to attributes, other keys are attribute names."""

    __slots__ = ()
    seed_keys: ClassVar[dict[str, str]] = {}

    def __getitem__(self, key: str) -> Any:
        return getattr(self, self.seed_keys.get(key, key))

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except AttributeError:
            return default


class Job(SeedKeys):
    """One claimed job. Attributes mirror the jobs table's columns (see the README).

    ``attempt`` is the number of the attempt now running (1 for the first run).
    """

    seed_keys = _SEED_KEYS

    __slots__ = (
        "id",
        "queue",
        "task",
        "payload",
        "payload_hash",
        "priority",
        "status",
        "run_at",
        "attempt",
        "max_attempts",
        "message",
        "origin",
        "destination",
        "external_key",
        "tenant",
        "business_group",
        "publication_id",
        "subscription_id",
        "dead",
        "live_id",
        "first_attempt_at",
        "previous_attempt_at",
        "previous_status",
        "previous_message",
        "created_at",
        "started_at",
        "worker_id",
    )

    def __init__(self, **fields: Any) -> None:
        for name in self.__slots__:
            setattr(self, name, fields.get(name))

    @classmethod
    def from_row(cls, row: Any, attempt_increment: int) -> Job:
        job = cls(**row._mapping)
        job.attempt = (job.attempt or 0) + attempt_increment
        return job

    @classmethod
    def from_tuple(cls, row: Any, attempt_increment: int) -> Job:
        """A Job from a row whose columns are ROW_FIELDS, in that order (the claim's select):
        positional, because building a mapping per row costs more than the rest of a no-op job."""
        job = cls.__new__(cls)
        _fill_from_row(job, row)
        job.attempt = (job.attempt or 0) + attempt_increment
        if type(job.max_attempts) is not int:  # SQLite keeps any text a hand-written row gives
            raise TypeError(f"max_attempts is {job.max_attempts!r}, not a whole number")
        return job

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.task!r} queue={self.queue!r} attempt={self.attempt}>"


#: The columns a claim selects, in order: every attribute, the claim time last.
ROW_FIELDS = tuple(name for name in Job.__slots__ if name != "started_at") + ("started_at",)


def _row_filler(fields: tuple[str, ...]) -> Any:
    """``def fill(job, row): job.a, job.b, … = row``: one unpacking assignment, generated once,
    sets a claimed row's 27 attributes in a third of the time of a setattr loop (and, like
    ``zip(strict=True)``, refuses a row of the wrong length)."""
    targets = ", ".join(f"job.{name}" for name in fields)
    namespace: dict[str, Any] = {}
    exec(f"def fill(job, row):\n    {targets} = row\n", namespace)  # noqa: S102 - fixed names
    return namespace["fill"]


_fill_from_row = _row_filler(ROW_FIELDS)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)

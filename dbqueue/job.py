"""The job as handlers see it, and the statuses a job row moves through."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar


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
    #: A keyed job waiting behind another job of its key: outside the claim index's range, so
    #: a long line behind one busy key costs the claims of everything else nothing.
    BLOCKED = "blocked"

    ALL = (AVAILABLE, RUNNING, SUCCEEDED, DEAD, CANCELLED, BLOCKED)
    FINISHED = (SUCCEEDED, DEAD, CANCELLED)
    PENDING = (AVAILABLE, RUNNING, BLOCKED)
    #: Not started: what a cancel ends at once.
    WAITING = (AVAILABLE, BLOCKED)

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


class ItemAccess:
    """``obj["name"]`` and ``obj.get("name", default)`` for code written against dict rows.

    A name in ``ITEM_ALIASES`` resolves through it (an attribute name, or a function of the
    object); any other must be one of ``ITEM_NAMES``, the attributes that mirror the table's
    columns. The aliases are the seed's column names (``SEED_JOB_KEYS`` below; a Subscription's
    in its class), for code ported from the seed.
    """

    __slots__ = ()
    ITEM_NAMES: ClassVar[frozenset[str]] = frozenset()
    ITEM_ALIASES: ClassVar[Mapping[str, str | Callable[[Any], Any]]] = {}

    def __getitem__(self, key: str) -> Any:
        alias = self.ITEM_ALIASES.get(key)
        if alias is not None:
            return alias(self) if callable(alias) else getattr(self, alias)
        if key in self.ITEM_NAMES:
            return getattr(self, key)
        raise KeyError(
            f"{key!r} is not a key of {type(self).__name__}: its keys are its table's column "
            "names (see the README), and the seed's"
        )

    def __contains__(self, key: object) -> bool:
        return key in self.ITEM_ALIASES or key in self.ITEM_NAMES

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


#: The jobs table's columns a Job mirrors (a claim selects them as ``ROW_FIELDS``).
COLUMNS: tuple[str, ...] = (
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
    "awaited",
    "unique_key",
    "scored_payloads",
    "key",
    "key_seq",
    "traceparent",
)


class Job(ItemAccess):
    """One claimed job. Attributes mirror the jobs table's columns (see the README).

    ``attempt`` is the number of the attempt now running (1 for the first run).
    """

    __slots__ = (*COLUMNS, "cancel_requested_at", "_row", "_fill")
    ITEM_NAMES = frozenset(COLUMNS)
    ITEM_ALIASES: ClassVar[Mapping[str, str | Callable[[Job], Any]]] = {}

    # The slots' types, for type checkers (bare annotations add no class attribute).
    id: int
    queue: str
    task: str
    payload: Any  # the decoded JSON
    payload_hash: str | None
    priority: int
    status: str
    run_at: dt.datetime
    attempt: int  # the attempt now running, from 1
    max_attempts: int
    message: str | None
    origin: str | None
    destination: str | None
    external_key: str | None
    tenant: int | None
    business_group: str | None
    publication_id: int | None
    subscription_id: str | None
    dead: bool
    live_id: int | None
    first_attempt_at: dt.datetime | None
    previous_attempt_at: dt.datetime | None
    previous_status: str | None
    previous_message: str | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    worker_id: str | None
    awaited: bool | None  # a caller waits for this job's end (app.call)
    unique_key: str | None  # the key it holds among the queue's unfinished jobs
    scored_payloads: list | None  # a coalescing task's [[score, payload], …], by score
    key: str | None  # jobs of a queue sharing a key never run at once
    key_seq: int | None  # its place in its key's line (None: unkeyed, or not admitted yet)
    traceparent: str | None  # the enqueuer's trace context (dbqueue.tracing)
    #: Not a column: when a cancel request for this job was made (the database's UTC time),
    #: set by the worker once the request reaches the job while it runs; else None.
    cancel_requested_at: dt.datetime | None
    # Not columns: a claimed job's row and the function that reads its LAZY columns from it.
    _row: Any
    _fill: Callable[[Job, Any], None] | None

    def __init__(self, **fields: Any) -> None:
        for name in COLUMNS:
            setattr(self, name, fields.get(name))
        self.cancel_requested_at = None

    if not TYPE_CHECKING:  # a __getattr__ would make every misspelt attribute pass mypy

        def __getattr__(self, name: str) -> Any:
            """Only reached for an attribute never set: a claimed job's LAZY columns, read from the
            claimed row on first use (by ``row_reader``'s ``_fill``, all at once)."""
            if name in _LAZY_SET:
                try:
                    fill = self._fill
                except AttributeError:
                    fill = None
                if fill is not None:
                    fill(self, self._row)
                    return _SLOTS[name].__get__(self, Job)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> dict[str, Any]:
        """What a copy or a pickle holds: every column's value (lazy ones read now), not the
        claimed row and its reader."""
        state = {name: getattr(self, name) for name in COLUMNS}
        state["cancel_requested_at"] = getattr(self, "cancel_requested_at", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    @property
    def payloads(self) -> list[Any]:
        """Every payload merged into this job, by score (lowest first); ``payload`` is the
        last. A job of a task without ``coalesce=True`` has one: its payload."""
        if not self.scored_payloads:
            return [self.payload]
        return [payload for _, payload in self.scored_payloads]

    def cancel_requested(self) -> bool:
        """Whether ``app.cancel`` asked for this job to stop while it runs.

        A long handler may check it between steps and return (or raise) early: the job then
        ends ``cancelled`` and its database writes roll back, however the handler ends. One
        that does not check is stopped by the worker like a timeout (JobCancelledError raised
        in its thread) a moment later. The worker looks for requests about once a second,
        only for jobs running longer than that; outside a worker this is always False.
        """
        return self.cancel_requested_at is not None

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
        job.cancel_requested_at = None
        job.attempt = (job.attempt or 0) + attempt_increment
        if type(job.max_attempts) is not int:  # SQLite keeps any text a hand-written row gives
            raise TypeError(f"max_attempts is {job.max_attempts!r}, not a whole number")
        return job

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in COLUMNS}

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.task!r} queue={self.queue!r} attempt={self.attempt}>"


#: The columns a claim selects, in order: every attribute, the claim time last.
ROW_FIELDS = tuple(name for name in COLUMNS if name != "started_at") + ("started_at",)

#: Columns the worker's path from claim to outcome never reads for a job that succeeds: a
#: claimed Job (``row_reader``) converts them from its row only when first read, which most
#: jobs never do (a third of a no-op job's claim is converting and setting attributes).
LAZY: tuple[str, ...] = (
    "payload_hash",
    "status",
    "run_at",
    "message",
    "origin",
    "destination",
    "external_key",
    "tenant",
    "business_group",
    "publication_id",
    "live_id",
    "first_attempt_at",
    "previous_attempt_at",
    "previous_status",
    "previous_message",
    "created_at",
    "worker_id",
)
_LAZY_SET = frozenset(LAZY)
_SLOTS: dict[str, Any] = {name: getattr(Job, name) for name in LAZY}


def _row_filler(fields: tuple[str, ...]) -> Callable[[Job, Any], None]:
    """``def fill(job, row): job.a, job.b, … = row``: one unpacking assignment, generated once,
    sets a claimed row's 27 attributes in a third of the time of a setattr loop (and, like
    ``zip(strict=True)``, refuses a row of the wrong length)."""
    targets = ", ".join(f"job.{name}" for name in fields)
    namespace: dict[str, Any] = {}
    exec(f"def fill(job, row):\n    {targets} = row\n", namespace)  # noqa: S102 - fixed names
    return namespace["fill"]


_fill_from_row = _row_filler(ROW_FIELDS)


def row_reader(processors: Sequence[tuple[int, Callable[[Any], Any]]]) -> RowReader:
    """``read(row, attempt_increment) -> Job`` for a claim's raw driver row (columns
    ROW_FIELDS, in order), applying ``processors`` (column index → its type's result processor)
    as it fills the attributes: ``from_tuple`` on a processed row, generated once per statement
    without the copy of each row and the loop over its processors, the bulk of a no-op job's
    claim."""
    by_index = dict(processors)
    names = {index: f"p{index}" for index in by_index}
    values = [f"c{i}" for i in range(len(ROW_FIELDS))]
    lines = [f"    {', '.join(values)}, = row", "    job = new(Job)"]
    rest = []  # fill(job, row): the LAZY columns a job has not set since
    for index, name in enumerate(ROW_FIELDS):
        value = values[index]
        if index in names:
            value = f"{names[index]}({value})"
            if by_index[index](None) is None:  # most columns are NULL: no call for those
                value = f"None if {values[index]} is None else {value}"
        if name == "attempt":
            value = f"({value} or 0) + attempt_increment"
        if name in _LAZY_SET:
            rest += [f"    if unset(job, {name!r}):", f"        job.{name} = {value}"]
        else:
            lines.append(f"    job.{name} = {value}")
    lines += [
        "    job.cancel_requested_at = None",
        "    job._row = row",
        "    job._fill = fill",
        "    if type(job.max_attempts) is not int:",
        "        bad_max_attempts(job.max_attempts)",
        "    return job",
    ]
    unpack = f"    {', '.join(values)}, = row"
    source = (
        "def fill(job, row):\n" + unpack + "\n" + "\n".join(rest) + "\n"
        "def read(row, attempt_increment):\n" + "\n".join(lines) + "\n"
    )
    namespace: dict[str, Any] = {"new": object.__new__, "Job": Job, "unset": _unset}
    namespace["bad_max_attempts"] = _bad_max_attempts
    namespace.update({names[index]: process for index, process in by_index.items()})
    exec(source, namespace)  # noqa: S102 - fixed names and indexes
    return namespace["read"]


def _unset(job: Job, name: str) -> bool:
    """Whether the slot ``name`` of ``job`` holds no value (without reaching __getattr__)."""
    try:
        _SLOTS[name].__get__(job, Job)
    except AttributeError:
        return True
    return False


def _bad_max_attempts(value: Any) -> None:
    raise TypeError(f"max_attempts is {value!r}, not a whole number")


RowReader = Callable[[Any, int], Job]


# ---- the seed's column names (nsj-queue-lib) ----------------------------------------------
# The seed handed handlers the queue row as a dict keyed by its table's columns. dbqueue keeps
# one row per job where the seed kept one row per attempt, so a few of those columns are derived
# from several attributes. ``job["mensagem"]`` answers through this table.

#: The ``subscription_id`` of a publication's own row (finished from the start; its deliveries
#: carry their subscription's id).
PUBLICATION_MARKER = "*"

#: dbqueue's status → the seed's word. ``available`` depends on the job (see ``seed_status``);
#: a dead job's last attempt failed (``estouro_tentativas`` says attempts ran out); the seed
#: could not cancel, so ``cancelada`` is dbqueue's own word.
STATUS_WORDS: Mapping[str, str] = {
    Status.RUNNING: "processando",
    Status.SUCCEEDED: "sucesso",
    Status.DEAD: "falha",
    Status.CANCELLED: "cancelada",
    Status.FAILED: "falha",  # previous_status of a failed attempt
}


def _claimed(job: Job) -> bool:
    """Handed to a handler: running, or claimed in a transaction that leaves the row
    ``available`` until the outcome is written (the claim time is then set)."""
    return job.status == Status.RUNNING or (
        job.status == Status.AVAILABLE and job.started_at is not None
    )


def _in_future(when: dt.datetime | None) -> bool:
    if when is None:
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when > dt.datetime.now(dt.timezone.utc)


def seed_status(job: Job) -> str:
    """``agendada`` (waiting for its time), ``pendente`` (due), ``processando``, ``sucesso``,
    ``falha`` (dead) or ``cancelada``."""
    if _claimed(job):
        return "processando"
    if job.status == Status.AVAILABLE:
        return "agendada" if _in_future(job.run_at) else "pendente"
    return STATUS_WORDS.get(job.status, job.status)


def _waiting_for_retry(job: Job) -> bool:
    return job.status == Status.AVAILABLE and not _claimed(job) and job.previous_status is not None


#: Every column of the seed's queue table → a Job attribute, or a function of the Job.
SEED_JOB_KEYS: Mapping[str, str | Callable[[Job], Any]] = {
    "id": "id",
    "id_inicial": "id",  # one row per job: its first attempt is the job itself
    "data_hora_inicial": lambda job: job.first_attempt_at or job.started_at,
    "data_hora": "run_at",
    "origem": "origin",
    "destino": "destination",
    "processo": "task",
    "chave_externa": "external_key",
    "proxima_tentativa": lambda job: job.run_at if _waiting_for_retry(job) else None,
    "tentativa": "attempt",
    "status": seed_status,
    "reenfileirado": lambda job: False,  # the row is always the latest attempt
    "estouro_tentativas": lambda job: job.status == Status.DEAD,
    "mensagem": "message",
    "id_anterior": lambda job: job.id if job.previous_status is not None else None,
    "data_hora_anterior": "previous_attempt_at",
    "status_anterior": lambda job: STATUS_WORDS.get(job.previous_status, job.previous_status),
    "mensagem_anterior": "previous_message",
    "payload": "payload",
    "tenant": "tenant",
    "grupo_empresarial": "business_group",
    "payload_hash": "payload_hash",
    "pub_sub": lambda job: job.subscription_id == PUBLICATION_MARKER,
    "publication_id": "publication_id",
    "subscriber_id": "subscription_id",
    "dead": "dead",
    "live_id": "live_id",
    "prioridade": "priority",
}

Job.ITEM_ALIASES = SEED_JOB_KEYS

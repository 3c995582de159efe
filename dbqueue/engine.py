"""The job lifecycle in SQLAlchemy Core: insert, claim query, complete, fail, dead-letter, admin.

One QueueEngine serves one set of queue tables on one database. Every statement it builds is the
same on every database; what differs (the clock, column types) comes from the Dialect, and how a
claim is made exclusive comes from the strategy, which calls ``runnable()``. Nothing here tests a
database's name.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import payload as payload_codec
from .compiled import CompiledStatement
from .dialects import Dialect
from .errors import SchemaMissingError
from .job import ROW_FIELDS, Job, MalformedPayload, Status
from .schema import MAX_MESSAGE_CHARS, QueueTables
from .sqltypes import UtcDateTime

#: Rows per columnar INSERT (PostgreSQL): large enough that statement overhead vanishes.
_COLUMNAR_ROWS = 10_000
# SQLite's default limit (32766) is the lowest of the supported databases'.
_MAX_BIND_PARAMETERS = 32_000


@functools.cache
def _id_names(size: int) -> tuple[str, ...]:
    """Bind names of a completion's ids: ``id_0`` … ``id_<size-1>``."""
    return tuple(f"id_{i}" for i in range(size))


# Columns a claim returns before the claim time; Job has one attribute for each.
_JOB_COLUMNS = ROW_FIELDS[:-1]


def truncate(message: str | None) -> str | None:
    if message is None or len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - 20] + "\n…[truncated]"


# Columns every insert sets; the optional ones are sent only when a job sets them (the others
# keep their server defaults), which keeps bulk inserts small: most jobs set none of them.
_ALWAYS = ("task", "queue", "payload", "payload_hash", "priority", "max_attempts")
_OPTIONAL = (
    "run_at",
    "external_key",
    "origin",
    "destination",
    "tenant",
    "business_group",
    "publication_id",
    "subscription_id",
    "dead",
    "live_id",
)
#: What an optional column holds when a job leaves it unset (its server default).
_UNSET: dict[str, Any] = {"dead": False}


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
        for name in _OPTIONAL:
            value = getattr(self, name)
            if value is not None and value is not False:
                row[name] = value
        return row

    @property
    def timing(self) -> str:
        """How run_at is set: by the server default, from a delay, or to an explicit time."""
        if self.run_at is not None:
            return "run_at"
        return "delay" if self.delay else "now"


def _same_columns(rows: list[dict[str, Any]]) -> None:
    """A multi-row INSERT needs one column list: give every row the columns any row sets."""
    columns = set().union(*rows)
    for row in rows:
        if len(row) != len(columns):
            for name in columns.difference(row):
                row[name] = _UNSET.get(name)


@dataclass(frozen=True)
class FailResult:
    """What ``fail()`` did: rows changed (0 if the job was no longer ours), dead-letter job id."""

    changed: int
    dead_letter_id: int | None = None


@dataclass(frozen=True)
class QueueStats:
    queue: str
    counts: dict[str, int]
    scheduled: int
    oldest_runnable_age: float | None


class QueueEngine:
    def __init__(self, tables: QueueTables, dialect: Dialect) -> None:
        self.tables = tables
        self.dialect = dialect
        self.jobs = tables.jobs
        self._job_columns = [self.jobs.c[name] for name in _JOB_COLUMNS]
        self._claim_order = dialect.claim_order(self.jobs)
        self._claim_key = [column.name for column in self._claim_order]
        self._statements: dict[str, Any] = {}
        #: id(statement) -> (statement, its CompiledStatement); the statement is kept alive.
        self._compiled: dict[int, tuple[Any, CompiledStatement]] = {}

    # ---- enqueue ------------------------------------------------------------------------------
    def _insert_statement(self, timing: str) -> sa.Insert:
        """INSERT whose columns come from the parameters; with a delay, run_at is computed from
        the database clock and the ``delay_seconds`` parameter."""

        def build() -> sa.Insert:
            stmt = self._with_times(sa.insert(self.jobs), timing)
            if timing == "delay":
                delay = sa.bindparam("delay_seconds", type_=sa.Float())
                stmt = stmt.values(run_at=self.dialect.now_plus(delay))
            return stmt

        return self.statement(f"insert:{timing}", build)

    def insert(self, conn: Connection, job: NewJob) -> int:
        row = job.values()
        timing = job.timing
        if timing == "delay":
            row["delay_seconds"] = float(job.delay or 0)
        # Precompiled per set of columns: most of an enqueue's own CPU was SQLAlchemy's
        # execution and result layers around one INSERT. The id comes the way SQLAlchemy would
        # take it: the driver's lastrowid (MySQL, SQLite: no result set to parse), else
        # RETURNING.
        columns = tuple(row)
        if conn.dialect.postfetch_lastrowid:
            stmt = self.statement(
                f"insert:{timing}:{','.join(columns)}",
                lambda: self._build_insert(columns, timing),
            )
            with self.translate_errors():
                return int(self.compiled(stmt).lastrowid(conn, row))
        if self.dialect.returns_inserted_ids and conn.dialect.insert_returning:
            stmt = self.statement(
                f"insert:{timing}:returning:{','.join(columns)}",
                lambda: self._build_insert(columns, timing).returning(self.jobs.c.id),
            )
            with self.translate_errors():
                return int(self.compiled(stmt).raw_rows(conn, row)[0][0])
        with self.translate_errors():
            result = conn.execute(self._insert_statement(timing), row)
        return int(result.inserted_primary_key[0])

    def _build_insert(self, columns: tuple[str, ...], timing: str) -> sa.Insert:
        values = {
            name: sa.bindparam(name, type_=self.jobs.c[name].type)
            for name in columns
            if name != "delay_seconds"
        }
        return self._insert_statement(timing).values(values)

    def insert_finished(self, conn: Connection, job: NewJob, message: str) -> int:
        """Insert a row that is finished from the start (a publication's own record): no
        worker ever claims it, and purge removes it with the other finished jobs."""
        now = self.dialect.now()
        stmt = (
            self._with_times(sa.insert(self.jobs), job.timing)
            .values(job.values())
            .values(status=Status.SUCCEEDED, message=truncate(message), finished_at=now)
        )
        with self.translate_errors():
            result = conn.execute(stmt)
        return int(result.inserted_primary_key[0])

    def insert_many(self, conn: Connection, jobs: Sequence[NewJob]) -> list[int]:
        """Insert with one multi-row statement per timing kind (usually just one); ids come back
        in the order of ``jobs``. On databases whose INSERT cannot return ids (MySQL 8,
        SingleStore) the list is empty.

        Ids are matched to rows by sorting: within one multi-row INSERT every supported database
        assigns ascending ids in VALUES order (a sequence/auto-increment is drawn row by row).
        SQLAlchemy's own ``sort_by_parameter_order`` would fall back to one INSERT per row on
        SQLite, which is what this method exists to avoid.
        """
        groups: dict[str, list[int]] = {}
        for index, job in enumerate(jobs):
            groups.setdefault(job.timing, []).append(index)
        ids: list[int | None] = [None] * len(jobs)
        returning = (
            self.dialect.returns_inserted_ids
            and conn.dialect.insert_returning
            and conn.dialect.insert_executemany_returning
        )
        for timing, indexes in groups.items():
            rows = [jobs[i].values() for i in indexes]
            if timing != "delay" and returning and len(rows) > 1:
                columnar = self._insert_columnar(conn, rows, timing)
                if columnar is not None:
                    for i, new_id in zip(indexes, columnar, strict=True):
                        ids[i] = new_id
                    continue
            if timing == "delay":
                for i, row in zip(indexes, rows, strict=True):
                    row["delay_seconds"] = float(jobs[i].delay or 0)
            _same_columns(rows)
            stmt = self._insert_statement(timing)
            # As many rows per statement as the drivers' bind-parameter limits allow.
            page = max(1, _MAX_BIND_PARAMETERS // (len(rows[0]) + 1))
            with self.translate_errors():
                if returning:
                    stmt = self.statement(
                        f"insert:{timing}:returning", lambda s=stmt: s.returning(self.jobs.c.id)
                    )
                    result = conn.execution_options(insertmanyvalues_page_size=page).execute(
                        stmt, rows
                    )
                    for i, new_id in zip(indexes, sorted(result.scalars()), strict=True):
                        ids[i] = int(new_id)
                else:
                    conn.execute(stmt, rows)
        return [i for i in ids if i is not None]

    def _insert_columnar(
        self, conn: Connection, rows: list[dict[str, Any]], timing: str
    ) -> list[int] | None:
        """Insert rows as one list per column where the dialect can (PostgreSQL's unnest);
        returns their ids in order, or None to use the multi-row VALUES insert."""
        _same_columns(rows)
        columns = tuple(sorted(rows[0]))
        stmt = self.statement(
            f"insert:columnar:{timing}:{','.join(columns)}",
            lambda: self._build_columnar(columns, timing),
        )
        if stmt is False:
            return None
        found: list[int] = []
        for first in range(0, len(rows), _COLUMNAR_ROWS):
            chunk = rows[first : first + _COLUMNAR_ROWS]
            params = {name: [row[name] for row in chunk] for name in columns}
            with self.translate_errors():
                found += sorted(int(i) for i in conn.execute(stmt, params).scalars())
        return found

    def _build_columnar(self, columns: tuple[str, ...], timing: str) -> Any:
        stmt = self.dialect.columnar_insert(self.jobs, columns)
        if stmt is None:
            return False  # remembered: this dialect has none
        return self._with_times(stmt, timing).returning(self.jobs.c.id)

    def _with_times(self, stmt: sa.Insert, timing: str) -> sa.Insert:
        """Where the DDL defaults cannot be the UTC clock, write it explicitly."""
        if not self.dialect.insert_sets_times:
            return stmt
        now = self.dialect.now()
        stmt = stmt.values(created_at=now, updated_at=now)
        return stmt.values(run_at=now) if timing == "now" else stmt

    # ---- claim --------------------------------------------------------------------------------
    def db_now(self) -> sa.ColumnElement:
        """The database clock, typed so that Python receives an aware UTC datetime."""
        return sa.type_coerce(self.dialect.now(), UtcDateTime())

    def statement(self, key: str, build: Callable[[], Any]) -> Any:
        """A statement built once per QueueEngine and reused: executing the same object skips
        SQLAlchemy's construction and cache-key work, which dominates a no-op job's cost."""
        found = self._statements.get(key)
        if found is None:
            found = self._statements[key] = build()
        return found

    def compiled(self, stmt: Any) -> CompiledStatement:
        """``stmt`` (one of the statements above, built once) compiled for the hot path."""
        found = self._compiled.get(id(stmt))
        if found is None:
            found = self._compiled[id(stmt)] = (
                stmt,
                CompiledStatement(stmt, self.dialect.sa_dialect),
            )
        return found[1]

    def runnable(self, queue: str | None = None, limit: int | None = None) -> sa.Select:
        """Runnable jobs of one queue in claim order; strategies add their locking to it.

        Without arguments the queue and limit are the bind parameters ``queue`` and ``limit``
        (what the claim executes); with them, the values are bound (for EXPLAIN and tests).
        """
        stmt = self.statement("runnable", self._build_runnable)
        if queue is None and limit is None:
            return stmt
        return stmt.params(queue=queue, limit=limit)

    def _build_runnable(self) -> sa.Select:
        j = self.jobs
        return (
            sa.select(*self._claim_columns(), self.db_now().label("started_at"))
            .where(
                j.c.status == Status.AVAILABLE,
                j.c.queue == sa.bindparam("queue", type_=j.c.queue.type),
                j.c.run_at <= self.dialect.now(),
            )
            .order_by(*self._claim_order)
            .limit(sa.bindparam("limit", type_=sa.Integer()))
        )

    def _claim_columns(self) -> list[sa.ColumnElement]:
        return [
            self.dialect.payload_read(column) if column.name == "payload" else column
            for column in self._job_columns
        ]

    def fetch_jobs(
        self, conn: Connection, stmt: sa.Select, queue: str, limit: int, attempt_increment: int
    ) -> list[Job]:
        """Execute a claim built on ``runnable()`` and turn its rows into Jobs.

        A row whose values cannot make a Job (written by hand into SQLite, which stores any
        text in any column) would fail every claim that reaches it: such rows are set aside as
        dead, each with a message naming the problem, and the claim returns nothing this round.
        """
        compiled = self.compiled(stmt)
        for _ in range(2):
            rows = compiled.raw_rows(conn, {"queue": queue, "limit": limit})
            try:
                return [Job.from_tuple(compiled.process(row), attempt_increment) for row in rows]
            except (TypeError, ValueError):
                if not self.set_aside_unreadable(conn, [row[0] for row in rows]):
                    raise
        return []

    def set_aside_unreadable(self, conn: Connection, ids: Sequence[int]) -> int:
        """Mark dead, with a message, those of ``ids`` whose rows cannot make a Job."""
        j = self.jobs
        found = 0
        for job_id in ids:
            try:
                row = conn.execute(sa.select(*self._job_columns).where(j.c.id == job_id)).one()
                Job.from_tuple((*row, None), 0)
            except (TypeError, ValueError) as exc:
                now = self.dialect.now()
                message = (
                    f"the row of job {job_id} cannot be read ({type(exc).__name__}: {exc}); it "
                    "was probably written by hand with a value its column cannot hold: fix the "
                    f"row, then requeue it (dbqueue dead requeue {job_id})"
                )
                conn.execute(
                    sa.update(j)
                    .where(j.c.id == job_id, j.c.status == Status.AVAILABLE)
                    .values(status=Status.DEAD, message=message, finished_at=now, updated_at=now)
                )
                found += 1
        return found

    def candidate_ids(self, conn: Connection, queue: str, limit: int, offset: int = 0) -> list[int]:
        """Ids of runnable jobs in claim order, without locking (lock-based strategies)."""
        j = self.jobs
        stmt = (
            sa.select(j.c.id)
            .where(
                j.c.status == Status.AVAILABLE,
                j.c.queue == queue,
                j.c.run_at <= self.dialect.now(),
            )
            .order_by(*self._claim_order)
            .limit(limit)
            .offset(offset)
        )
        return list(conn.execute(stmt).scalars())

    def claim_ids(self, conn: Connection, ids: Sequence[int], worker_id: str) -> list[Job]:
        """Mark jobs whose locks the caller holds as running, counting the attempt, and return
        those still runnable (another worker may have finished one since it was listed)."""
        j = self.jobs
        now = self.dialect.now()
        stmt = (
            sa.update(j)
            .where(
                j.c.id.in_(ids),
                self.dialect.unindexed(j.c.status) == Status.AVAILABLE,
                j.c.run_at <= now,
            )
            .values(
                status=Status.RUNNING,
                attempt=j.c.attempt + 1,
                started_at=now,
                first_attempt_at=sa.func.coalesce(j.c.first_attempt_at, now),
                worker_id=worker_id,
                updated_at=now,
            )
        )
        columns = (*self._job_columns, j.c.started_at)
        if conn.dialect.update_returning:
            rows = conn.execute(stmt.returning(*columns)).all()
        else:
            conn.execute(stmt)
            rows = conn.execute(
                sa.select(*columns).where(
                    j.c.id.in_(ids), j.c.status == Status.RUNNING, j.c.worker_id == worker_id
                )
            ).all()
        jobs = [Job.from_tuple(row, 0) for row in rows]
        jobs.sort(key=lambda job: tuple(getattr(job, name) for name in self._claim_key))
        return jobs

    def release_claims(
        self, conn: Connection, jobs: Sequence[Job], claimed_by: str | None = None
    ) -> None:
        """Undo claim_ids for jobs that were never started (the worker is stopping), or whose
        transaction rolled back; ``claimed_by`` leaves alone jobs another worker took over."""
        if not jobs:
            return
        j = self.jobs
        now = self.dialect.now()
        guard = [
            j.c.id.in_([job.id for job in jobs]),
            j.c.status == Status.RUNNING,
            *self._claimed_by(claimed_by),
        ]
        # Ordered: MySQL evaluates SET left to right, so columns read before attempt changes.
        conn.execute(
            sa.update(j)
            .where(*guard)
            .ordered_values(
                (
                    j.c.first_attempt_at,
                    sa.case((j.c.attempt <= 1, sa.null()), else_=j.c.first_attempt_at),
                ),
                (j.c.started_at, j.c.previous_attempt_at),
                (j.c.status, Status.AVAILABLE),
                (j.c.attempt, j.c.attempt - 1),
                (j.c.worker_id, None),
                (j.c.updated_at, now),
            )
        )

    def running_jobs(self, conn: Connection, limit: int) -> list[Job]:
        j = self.jobs
        rows = conn.execute(
            sa.select(*self._job_columns, j.c.started_at)
            .where(j.c.status == Status.RUNNING)
            .order_by(j.c.id)
            .limit(limit)
        )
        return [Job.from_tuple(row, 0) for row in rows]

    def runnable_queues(self, conn: Connection, waited: float = 0.0) -> list[str]:
        """Queues holding jobs that have been runnable for at least ``waited`` seconds."""
        j = self.jobs
        rows = conn.execute(
            sa.select(j.c.queue)
            .where(j.c.status == Status.AVAILABLE, j.c.run_at <= self.dialect.now_plus(-waited))
            .group_by(j.c.queue)
        )
        return sorted(rows.scalars())

    def purge_chunk(self, conn: Connection, max_age_days: float, limit: int) -> int:
        """Delete up to ``limit`` finished jobs older than ``max_age_days``, oldest first.

        Two statements (ids, then DELETE by id) because MySQL/MariaDB reject LIMIT in an IN
        subquery, and one form serves every database.
        """
        j = self.jobs
        cutoff = self.dialect.now_plus(-max_age_days * 86400)
        ids = list(
            conn.execute(
                sa.select(j.c.id)
                .where(j.c.status.in_(Status.FINISHED), j.c.finished_at < cutoff)
                .order_by(j.c.finished_at)
                .limit(limit)
            ).scalars()
        )
        if ids:
            conn.execute(sa.delete(j).where(j.c.id.in_(ids), j.c.status.in_(Status.FINISHED)))
        return len(ids)

    # ---- outcomes -----------------------------------------------------------------------------
    def complete(
        self,
        conn: Connection,
        done: Sequence[tuple[Job, str | None]],
        *,
        attempt_increment: int,
        expected_status: str,
        worker_id: str,
        claimed_by: str | None = None,
    ) -> int:
        """Mark a batch succeeded with one UPDATE; returns how many rows it changed.

        ``claimed_by``: only rows this worker claimed (a committed claim's fence: a job that
        was rescued and claimed again since belongs to someone else)."""
        if not done:
            return 0
        messages = {job.id: truncate(message) for job, message in done if message is not None}
        params = {
            "expected_status": expected_status,
            "increment": attempt_increment,
            "started": done[0][0].started_at,
            "worker_id": worker_id,
        }
        fenced = claimed_by is not None
        if fenced:
            params["claimed_by"] = claimed_by
        ids = [job.id for job, _ in done]
        if not messages:
            # One statement per batch length, ids as separate parameters: compiled in advance.
            size = len(ids)
            stmt = self.statement(
                f"complete:{fenced}:{size}",
                lambda: self._build_complete(sa.null(), fenced, self._id_list(size)),
            )
            params.update(zip(_id_names(size), ids, strict=True))
            return self.compiled(stmt).rowcount(conn, params)
        # Handlers that return a message: one CASE arm per message (rarer, built per batch).
        j = self.jobs
        params["ids"] = ids
        stmt = self._build_complete(
            sa.case(messages, value=j.c.id, else_=sa.null()),
            fenced,
            self.dialect.in_list(j.c.id, "ids"),
        )
        return conn.execute(stmt, params).rowcount

    def _id_list(self, size: int) -> sa.ColumnElement:
        id_type = self.jobs.c.id.type
        binds = [sa.bindparam(name, type_=id_type) for name in _id_names(size)]
        return self.jobs.c.id.in_(binds)

    def _build_complete(
        self, message: sa.ColumnElement, fenced: bool, ids: sa.ColumnElement
    ) -> sa.Update:
        j = self.jobs
        now = self.dialect.now()
        started = sa.bindparam("started", type_=j.c.started_at.type)
        fence = [j.c.worker_id == sa.bindparam("claimed_by", type_=j.c.worker_id.type)]
        return (
            sa.update(j)
            .where(
                ids,
                self.dialect.unindexed(j.c.status)
                == sa.bindparam("expected_status", type_=j.c.status.type),
                *(fence if fenced else []),
            )
            .values(
                status=Status.SUCCEEDED,
                attempt=j.c.attempt + sa.bindparam("increment", type_=sa.Integer()),
                message=message,
                started_at=started,
                first_attempt_at=sa.func.coalesce(j.c.first_attempt_at, started),
                finished_at=now,
                updated_at=now,
                worker_id=sa.bindparam("worker_id", type_=j.c.worker_id.type),
            )
        )

    def fail(
        self,
        conn: Connection,
        job: Job,
        message: str,
        *,
        retry_in: float | None,
        attempt_increment: int,
        expected_status: str,
        worker_id: str,
        dead_letter: bool,
        claimed_by: str | None = None,
        same_attempt: bool = False,
    ) -> FailResult:
        """Record a failed attempt: retry after ``retry_in`` seconds, or mark the job dead.

        When the job dies and its task has a dead handler, a new job with the same payload, the
        dead flag and the live job's id is inserted in the same transaction (the seed's
        dead queue). ``claimed_by`` fences the UPDATE like ``complete()``'s; a job the UPDATE
        did not change (no longer ours, or already finished) gets no dead-letter job.
        ``same_attempt``: change the row only if it is still at the attempt that ran (a
        compare-and-set for outcomes written outside the claim's transaction, which another
        worker may have claimed again since).
        """
        j = self.jobs
        message = truncate(message)
        now = self.dialect.now()
        values: dict[str, Any] = {
            "attempt": j.c.attempt + attempt_increment,
            "message": message,
            "started_at": job.started_at,
            "first_attempt_at": sa.func.coalesce(j.c.first_attempt_at, job.started_at),
            "previous_attempt_at": job.started_at,
            "previous_status": Status.FAILED,
            "previous_message": message,
            "updated_at": now,
            "worker_id": worker_id,
        }
        if retry_in is None:
            values.update(status=Status.DEAD, finished_at=now)
        else:
            values.update(status=Status.AVAILABLE, run_at=self.dialect.now_plus(retry_in))
        guard = [j.c.id == job.id, j.c.status == expected_status, *self._claimed_by(claimed_by)]
        if same_attempt:
            guard.append(j.c.attempt == job.attempt - attempt_increment)
        changed = conn.execute(sa.update(j).where(*guard).values(values)).rowcount
        if changed and retry_in is None and dead_letter and not job.dead:
            return FailResult(changed, self.insert(conn, self.dead_letter_of(job)))
        return FailResult(changed)

    def _claimed_by(self, worker_id: str | None) -> list[sa.ColumnElement]:
        return [] if worker_id is None else [self.jobs.c.worker_id == worker_id]

    @staticmethod
    def dead_letter_of(job: Job) -> NewJob:
        stored = job.payload
        encoded = (
            payload_codec.EncodedPayload(stored.raw)
            if isinstance(stored, MalformedPayload)
            else payload_codec.encode(stored, max_bytes=None)
        )
        return NewJob(
            task=job.task,
            payload=encoded,
            queue=job.queue,
            priority=job.priority,
            max_attempts=job.max_attempts,
            external_key=job.external_key,
            origin=job.origin,
            destination=job.destination,
            tenant=job.tenant,
            business_group=job.business_group,
            publication_id=job.publication_id,
            subscription_id=job.subscription_id,
            dead=True,
            live_id=job.id,
        )

    # ---- queries ------------------------------------------------------------------------------
    def get(self, conn: Connection, job_id: int) -> dict[str, Any] | None:
        with self.translate_errors():
            row = conn.execute(sa.select(self.jobs).where(self.jobs.c.id == job_id)).first()
        return dict(row._mapping) if row is not None else None

    def find_equivalent(
        self,
        conn: Connection,
        task: str,
        encoded: payload_codec.EncodedPayload,
        statuses: Iterable[str],
        filters: dict[str, Any],
    ) -> list[dict[str, Any]]:
        j = self.jobs
        stmt = sa.select(self.jobs).where(
            j.c.task == task,
            j.c.payload_hash == payload_codec.payload_hash(encoded),
            j.c.status.in_(list(statuses)),
        )
        for column, value in filters.items():
            stmt = stmt.where(j.c[column].is_(None) if value is None else j.c[column] == value)
        with self.translate_errors():
            rows = conn.execute(stmt.order_by(j.c.id)).all()
        return [dict(row._mapping) for row in rows]

    def stats(self, conn: Connection) -> tuple[list[QueueStats], dt.datetime]:
        """Counts per queue and status, scheduled jobs, and the age of the oldest runnable job."""
        j = self.jobs
        now = self.dialect.now()
        waiting = j.c.status == Status.AVAILABLE
        scheduled = sa.case((sa.and_(waiting, j.c.run_at > now), 1), else_=0)
        runnable_since = sa.case((sa.and_(waiting, j.c.run_at <= now), j.c.run_at), else_=None)
        stmt = sa.select(
            j.c.queue,
            j.c.status,
            sa.func.count().label("n"),
            sa.func.sum(scheduled).label("scheduled"),
            sa.type_coerce(sa.func.min(runnable_since), UtcDateTime()).label("oldest"),
        ).group_by(j.c.queue, j.c.status)
        with self.translate_errors():
            db_now = conn.execute(sa.select(self.db_now())).scalar_one()
            rows = conn.execute(stmt).all()
        by_queue: dict[str, dict[str, Any]] = {}
        for queue, status, n, n_scheduled, oldest in rows:
            entry = by_queue.setdefault(queue, {"counts": {}, "scheduled": 0, "oldest": None})
            entry["counts"][status] = int(n)
            entry["scheduled"] += int(n_scheduled or 0)
            if oldest is not None:
                entry["oldest"] = (
                    oldest if entry["oldest"] is None else min(entry["oldest"], oldest)
                )
        result = [
            QueueStats(
                queue=queue,
                counts=entry["counts"],
                scheduled=entry["scheduled"],
                oldest_runnable_age=(db_now - entry["oldest"]).total_seconds()
                if entry["oldest"] is not None
                else None,
            )
            for queue, entry in sorted(by_queue.items())
        ]
        return result, db_now

    def dead_jobs(self, conn: Connection, queue: str | None, limit: int) -> list[dict[str, Any]]:
        j = self.jobs
        stmt = sa.select(self.jobs).where(j.c.status == Status.DEAD)
        if queue is not None:
            stmt = stmt.where(j.c.queue == queue)
        with self.translate_errors():
            rows = conn.execute(stmt.order_by(j.c.finished_at.desc(), j.c.id.desc()).limit(limit))
            return [dict(row._mapping) for row in rows]

    def requeue_dead(self, conn: Connection, ids: Sequence[int]) -> list[int]:
        """Put dead jobs back to run now with a fresh attempt count; returns the ids requeued."""
        j = self.jobs
        with self.translate_errors():
            found = (
                conn.execute(sa.select(j.c.id).where(j.c.id.in_(ids), j.c.status == Status.DEAD))
                .scalars()
                .all()
            )
            if found:
                now = self.dialect.now()
                # previous_message is assigned first: MySQL evaluates SET left to right with the
                # values already assigned, so it must copy message before message changes.
                conn.execute(
                    sa.update(j)
                    .where(j.c.id.in_(found), j.c.status == Status.DEAD)
                    .ordered_values(
                        (j.c.previous_message, j.c.message),
                        (j.c.previous_status, Status.DEAD),
                        (j.c.message, "requeued from the dead jobs"),
                        (j.c.status, Status.AVAILABLE),
                        (j.c.attempt, 0),
                        (j.c.run_at, now),
                        (j.c.finished_at, None),
                        (j.c.worker_id, None),
                        (j.c.updated_at, now),
                    )
                )
        return sorted(int(i) for i in found)

    # ---- maintenance bookkeeping --------------------------------------------------------------
    def claim_tick(self, conn: Connection, routine: str, tick: dt.datetime, worker_id: str) -> bool:
        """Compare-and-set: the one worker whose UPDATE moves last_tick forward runs the tick.

        Every database re-checks the WHERE clause on the row's latest committed version after
        waiting for a concurrent updater, so exactly one of the workers meeting on a tick wins.
        """
        m = self.tables.maintenance
        now = self.dialect.now()
        result = conn.execute(
            sa.update(m)
            .where(m.c.routine == routine, sa.or_(m.c.last_tick.is_(None), m.c.last_tick < tick))
            .values(
                last_tick=tick,
                started_at=now,
                finished_at=None,
                worker_id=worker_id,
                runs=m.c.runs + 1,
                result=None,
            )
        )
        return result.rowcount == 1

    def record_tick(self, conn: Connection, routine: str, tick: dt.datetime, result: str) -> None:
        m = self.tables.maintenance
        conn.execute(
            sa.update(m)
            .where(m.c.routine == routine, m.c.last_tick == tick)
            .values(finished_at=self.dialect.now(), result=truncate(result))
        )

    def maintenance_status(self, conn: Connection) -> list[dict[str, Any]]:
        m = self.tables.maintenance
        with self.translate_errors():
            rows = conn.execute(sa.select(m).order_by(m.c.routine))
            return [dict(row._mapping) for row in rows]

    def next_due_in(self, conn: Connection, queues: Sequence[str]) -> float | None:
        """Seconds until the earliest scheduled job of these queues becomes runnable.

        Only future jobs count: past-due ones that a claim did not get are held by other
        workers (a SKIP LOCKED claim leaves them 'available' until it commits).
        """
        j = self.jobs
        soonest = conn.execute(
            sa.select(
                sa.type_coerce(sa.func.min(j.c.run_at), UtcDateTime()),
                self.db_now(),
            ).where(
                j.c.status == Status.AVAILABLE,
                j.c.queue.in_(list(queues)),
                j.c.run_at > self.dialect.now(),
            )
        ).one()
        if soonest[0] is None:
            return None
        return max(0.0, (soonest[0] - soonest[1]).total_seconds())

    # ---- errors -------------------------------------------------------------------------------
    def translate_errors(self) -> _TranslateErrors:
        return _TranslateErrors(self)


class _TranslateErrors:
    """Turn "no such table" from any driver into SchemaMissingError naming the fix."""

    def __init__(self, engine: QueueEngine) -> None:
        self.engine = engine

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, sa.exc.DBAPIError) and self.engine.dialect.is_missing_table(exc):
            names = self.engine.tables.names
            where = f" in schema {names.schema!r}" if names.schema else ""
            raise SchemaMissingError(
                f"the queue table {names.jobs!r}{where} does not exist: run `dbqueue migrate` "
                "(with the same URL and table prefix) to create it"
            ) from exc
        return False

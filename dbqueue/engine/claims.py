"""Claims: what a strategy locks and marks to claim jobs, and the turning of claimed rows into
Jobs. The strategies receive this part (``engine.claims``) and decide the locking; the SQL is
the catalog's (``jobs_runnable`` and the statements beside it)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue.engine import catalog
from dbqueue.engine.catalog import LockExpression, id_names
from dbqueue.engine.compiled import CompiledStatement
from dbqueue.engine.keys import KeyLines
from dbqueue.engine.statements import Statements
from dbqueue.job import ROW_FIELDS, Job, RowReader, row_reader
from dbqueue.strategies.base import Fence

#: A strategy's locking of a select (``FOR UPDATE SKIP LOCKED``), applied once per statement.
Locking = Callable[[sa.Select], sa.Select]


class Claims:
    """The claim statements of one set of queue tables, as the strategies use them."""

    def __init__(self, sql: Statements, keys: KeyLines) -> None:
        self.sql = sql
        self.keys = keys
        self.dialect = sql.dialect
        #: What names this queue's locks: its jobs table, qualified.
        self.namespace = sql.tables.names.qualified_jobs
        #: Row readers by compiled statement (and, sorted ones, by columns skipped).
        self._readers: dict[int, RowReader] = {}
        self._sorted_readers: dict[tuple[int, int], tuple[RowReader, Any]] = {}

    # ---- what a strategy builds its statements from ------------------------------------------
    def cached(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """A strategy's own statement (a lock release), built once per ``key``."""
        return self.sql.cached(key, build)

    def compiled(self, stmt: Any) -> CompiledStatement:
        return self.sql.compiled(stmt)

    def runnable(
        self, queue: str | None = None, limit: int | None = None, locking: Locking | None = None
    ) -> sa.Select:
        """Runnable jobs of one queue in claim order, with ``locking`` (the strategy's, built
        once per locking function) applied.

        Without ``queue`` and ``limit`` they are the bind parameters ``queue`` and ``limit``
        (what the claim executes); with them, the values are bound (for EXPLAIN and tests)."""
        stmt = self.sql(catalog.jobs_runnable)
        if locking is not None:
            stmt = self.sql.cached((catalog.jobs_runnable, locking), lambda: locking(stmt))
        if queue is None and limit is None:
            return stmt
        return stmt.params(queue=queue, limit=limit)

    def runnable_of_task(
        self, queue: str, task: str, limit: int, exclude: Sequence[int] = ()
    ) -> sa.Select:
        """``runnable()`` narrowed to one task, leaving out the jobs this transaction already
        holds: a batch handler's gathering (run with ``fetch_waiting``; the strategy locks it
        as it locks ``runnable()``)."""
        stmt = self.sql.new(catalog.jobs_runnable_of_task, task, exclude)
        return stmt.params(queue=queue, limit=limit)

    def waiting(self, ids: Sequence[int]) -> sa.Select:
        """These jobs, if they still wait, whatever their run_at, in claim order: eager mode's
        claim (a job runs as its enqueue commits, a retry at once), locked like ``runnable()``."""
        return self.sql.new(catalog.jobs_waiting_of, ids)

    def free_slot(self, locking: Locking | None = None) -> sa.Select:
        """The lowest free slot of queue ``:queue`` below ``:slots``, with ``locking``."""
        stmt = self.sql(catalog.slots_free)
        if locking is None:
            return stmt
        return self.sql.cached((catalog.slots_free, locking), lambda: locking(stmt))

    # ---- running them -------------------------------------------------------------------------
    def fetch_jobs(
        self, conn: Connection, stmt: sa.Select, queue: str, limit: int, attempt_increment: int
    ) -> list[Job]:
        """Execute a claim built on ``runnable()`` and turn its rows into Jobs.

        A row whose values cannot make a Job (written by hand into SQLite, which stores any
        text in any column) would fail every claim that reaches it: such rows are set aside as
        dead, each with a message naming the problem, and the claim returns nothing this round.
        """
        compiled = self.sql.compiled(stmt)
        read = self._readers.get(id(compiled))
        if read is None:
            read = self._readers[id(compiled)] = row_reader(compiled.result_processors)
        for _ in range(2):
            rows = compiled.raw_rows(conn, {"queue": queue, "limit": limit})
            try:
                jobs = [read(row, attempt_increment) for row in rows]
            except (TypeError, ValueError):
                if not self.set_aside_unreadable(conn, [row[0] for row in rows]):
                    raise
                continue
            return self.keys.admit(conn, jobs)
        return []

    def fetch_waiting(self, conn: Connection, stmt: sa.Select, attempt_increment: int) -> list[Job]:
        """Execute a claim built on ``waiting()`` or ``runnable_of_task()`` into Jobs."""
        jobs = [Job.from_tuple(row, attempt_increment) for row in conn.execute(stmt)]
        return self.keys.admit(conn, jobs)

    def take_slot(self, conn: Connection, stmt: sa.Select, queue: str, slots: int) -> int | None:
        """Execute a statement built on ``free_slot()``: the slot it locked, or None."""
        rows = self.sql.compiled(stmt).raw_rows(conn, {"queue": queue, "slots": slots})
        return int(rows[0][0]) if rows else None

    def record_slot(
        self, conn: Connection, queue: str, slot: int, job_id: int, worker_id: str
    ) -> None:
        """Write who holds a slot now (lock-based strategies, in their committed claim)."""
        conn.execute(self.sql.new(catalog.slots_record_holder, queue, slot, job_id, worker_id))

    def set_aside_unreadable(self, conn: Connection, ids: Sequence[int]) -> int:
        """Mark dead, with a message, those of ``ids`` whose rows cannot make a Job."""
        found = 0
        for job_id in ids:
            try:
                row = conn.execute(self.sql.new(catalog.jobs_row_of, job_id)).one()
                Job.from_tuple((*row, None), 0)
            except (TypeError, ValueError) as exc:
                queue, key, place = conn.execute(self.sql.new(catalog.jobs_line_of, job_id)).one()
                message = (
                    f"the row of job {job_id} cannot be read ({type(exc).__name__}: {exc}); it "
                    "was probably written by hand with a value its column cannot hold: fix the "
                    f"row, then requeue it (dbqueue dead requeue {job_id})"
                )
                with self.dialect.statements_together(conn):  # its death frees its key
                    conn.execute(self.sql.new(catalog.jobs_set_aside, job_id, message))
                    if place is not None:  # it headed its key's line (it was available)
                        self.keys.release_key(conn, queue, key, int(place), job_id)
                found += 1
        return found

    # ---- lock-based claims: list, lock, mark -------------------------------------------------
    def candidate_ids(
        self, conn: Connection, queue: str, limit: int, offset: int = 0, task: str | None = None
    ) -> list[int]:
        """Ids of runnable jobs in claim order, without locking (lock-based strategies);
        ``task``: of that task only (a batch handler's gathering)."""
        stmt = self.sql(catalog.jobs_candidate_ids, task is not None)
        params = {"queue": queue, "limit": limit, "offset": offset, "task": task}
        return [int(row[0]) for row in self.sql.compiled(stmt).raw_rows(conn, params)]

    def locked_candidates(
        self,
        conn: Connection,
        queue: str,
        limit: int,
        offset: int,
        task: str | None,
        lock: LockExpression,
    ) -> list[tuple[int, bool]]:
        """``candidate_ids`` and, in the same statement, ``lock(id)`` tried on each: (id,
        whether its lock was taken). ``lock`` is the same object for the same lock names
        (the statement is built once per)."""
        stmt = self.sql(catalog.jobs_candidate_ids_locked, lock, task is not None)
        params = {"queue": queue, "limit": limit, "offset": offset, "task": task}
        rows = conn.execute(stmt, params)
        return [(int(job_id), bool(taken)) for job_id, taken in rows]

    def lock_and_claim(
        self,
        conn: Connection,
        queue: str,
        limit: int,
        offset: int,
        worker_id: str,
        lock: LockExpression,
    ) -> tuple[list[int], list[Job]] | None:
        """``locked_candidates`` and ``claim_ids`` in one statement, where the dialect can write
        in a WITH clause (else None): the ids whose locks were taken, and the jobs claimed. A
        locked id with no job (claimed and finished since the window was read) is the
        caller's to release."""
        if not self.dialect.writes_in_with:
            return None
        compiled = self.sql.compiled(self.sql(catalog.jobs_lock_window_and_claim, lock))
        params = {"queue": queue, "limit": limit, "offset": offset, "worker_id": worker_id}
        rows = compiled.raw_rows(conn, params)
        locked = [int(row[0]) for row in rows if row[1]]
        read, order = self._reader(compiled, 2)
        claimed = sorted((row[2:] for row in rows if row[2] is not None), key=order)
        return locked, self.keys.admit(conn, [read(row, 0) for row in claimed])

    def claim_ids(
        self,
        conn: Connection,
        ids: Sequence[int],
        worker_id: str,
        due_only: bool = True,
        unflushed: bool = False,
    ) -> list[Job]:
        """Mark jobs whose locks the caller holds as running, counting the attempt, and return
        those still runnable (another worker may have finished one since it was listed).
        ``due_only=False``: whatever their run_at (eager mode's claim, see ``waiting()``);
        ``unflushed``: its transaction's commit need not wait for the disk
        (``Dialect.commit_unflushed``; the UPDATE may be a transaction of its own)."""
        size = len(ids)
        if not size:
            return []
        returning = bool(conn.dialect.update_returning)
        mark = self.sql.compiled(
            self.sql(catalog.jobs_mark_running, due_only, returning, size, unflushed)
        )
        params = {"worker_id": worker_id, **dict(zip(id_names(size), ids, strict=True))}
        if returning:
            found = mark
        else:
            mark.rowcount(conn, params)
            found = self.sql.compiled(self.sql(catalog.jobs_read_marked_running, size))
        read, order = self._reader(found)
        rows = sorted(found.raw_rows(conn, params), key=order)
        return self.keys.admit(conn, [read(row, 0) for row in rows])

    def _reader(self, found: CompiledStatement, skip: int = 0) -> tuple[RowReader, Any]:
        """A claim statement's row reader, and the claim order of its raw rows (an UPDATE
        returns them in no set order), for rows less their first ``skip`` columns: the order's
        few columns converted on their own, since reading a lazy one from a Job would convert
        all of its row (``job.LAZY``)."""
        key = (id(found), skip)
        made = self._sorted_readers.get(key)
        if made is not None:
            return made
        shifted = [(i - skip, p) for i, p in found.result_processors if i >= skip]
        processors = dict(shifted)
        columns = [ROW_FIELDS.index(name) for name in self.sql.claim_key]

        def order(row: Any) -> tuple:
            return tuple(
                processors[i](row[i]) if i in processors and row[i] is not None else row[i]
                for i in columns
            )

        made = self._sorted_readers[key] = (row_reader(shifted), order)
        return made

    # ---- leases: jobs run outside their claim's transaction -----------------------------------
    def lease(
        self, conn: Connection, jobs: Sequence[Job], worker_id: str, seconds: float, counted: bool
    ) -> int:
        """Commit-ready: mark claimed jobs running under a lease for ``worker_id`` (``counted``:
        a committed claim already marked them running and counted the attempt); returns the
        rows marked. The jobs' attempt is then the one counted in their rows."""
        size = len(jobs)
        stmt = self.sql(catalog.jobs_lease, size, counted)
        params = {"worker_id": worker_id, "lease_seconds": float(seconds)}
        if not counted:  # one claim's jobs: one claim time
            params["started"] = jobs[0].started_at
        params.update(zip(id_names(size), [job.id for job in jobs], strict=True))
        return self.sql.compiled(stmt).rowcount(conn, params)

    def extend_leases(
        self, conn: Connection, ids: Sequence[int], worker_ids: Sequence[str], seconds: float
    ) -> int:
        """Move on the leases of these jobs that still run under one of ``worker_ids``;
        returns how many rows it changed (fewer: a lease was lost, the job rescued)."""
        if not ids:
            return 0
        params = {"ids": list(ids), "workers": list(worker_ids), "lease_seconds": float(seconds)}
        return int(conn.execute(self.sql(catalog.jobs_extend_leases), params).rowcount)

    def release_claims(self, conn: Connection, jobs: Sequence[Job], fence: Fence) -> None:
        """Undo a committed claim of jobs never started (the worker is stopping), or whose
        transaction rolled back; the fence's ``claimed_by`` leaves alone jobs another worker
        took over."""
        if jobs:
            ids = [job.id for job in jobs]
            conn.execute(self.sql.new(catalog.jobs_unclaim, ids, fence.claimed_by))

"""Claims: the runnable query every strategy locks its own way, the fetch that turns claimed rows
into Jobs, and the lock-based strategies' list-then-mark pair and its undo."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue.engine.base import id_names
from dbqueue.engine.compiled import CompiledStatement
from dbqueue.engine.keys import Keys
from dbqueue.job import ROW_FIELDS, Job, RowReader, Status, row_reader


class Claims(Keys):
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

    def runnable_of_task(
        self, queue: str, task: str, limit: int, exclude: Sequence[int] = ()
    ) -> sa.Select:
        """``runnable()`` narrowed to one task, leaving out the jobs this transaction already
        holds (a lock never hides a row from its own holder): a batch handler's gathering
        (run with ``fetch_waiting``; strategies add their locking as to ``runnable()``)."""
        j = self.jobs
        stmt = self._build_runnable().where(j.c.task == task)
        if exclude:
            stmt = stmt.where(j.c.id.not_in(list(exclude)))
        return stmt.params(queue=queue, limit=limit)

    def _claim_columns(self) -> list[sa.ColumnElement]:
        return [
            self.dialect.payload_read(column) if column.name == "payload" else column
            for column in self._job_columns
        ]

    def fetch_jobs(
        self,
        conn: Connection,
        stmt: sa.Select,
        queue: str,
        limit: int,
        attempt_increment: int,
    ) -> list[Job]:
        """Execute a claim built on ``runnable()`` and turn its rows into Jobs.

        A row whose values cannot make a Job (written by hand into SQLite, which stores any
        text in any column) would fail every claim that reaches it: such rows are set aside as
        dead, each with a message naming the problem, and the claim returns nothing this round.
        """
        compiled = self.compiled(stmt)
        read = self.statement(
            f"reader:{id(compiled)}", lambda: row_reader(compiled.result_processors)
        )
        for _ in range(2):
            rows = compiled.raw_rows(conn, {"queue": queue, "limit": limit})
            try:
                jobs = [read(row, attempt_increment) for row in rows]
            except (TypeError, ValueError):
                if not self.set_aside_unreadable(conn, [row[0] for row in rows]):
                    raise
                continue
            return self.admit(conn, jobs)
        return []

    def waiting(self, ids: Sequence[int]) -> sa.Select:
        """These jobs, if they are still waiting (``available``), whatever their run_at, in
        claim order: eager mode's claim, which strategies lock their own way like
        ``runnable()``. It runs a job as its enqueue commits, and a retry at once."""
        j = self.jobs
        return (
            sa.select(*self._claim_columns(), self.db_now().label("started_at"))
            .where(j.c.id.in_(list(ids)), self.dialect.unindexed(j.c.status) == Status.AVAILABLE)
            .order_by(*self._claim_order)
        )

    def fetch_waiting(self, conn: Connection, stmt: sa.Select, attempt_increment: int) -> list[Job]:
        """Execute a claim built on ``waiting()`` and turn its rows into Jobs."""
        jobs = [Job.from_tuple(row, attempt_increment) for row in conn.execute(stmt)]
        return self.admit(conn, jobs)

    def set_aside_unreadable(self, conn: Connection, ids: Sequence[int]) -> int:
        """Mark dead, with a message, those of ``ids`` whose rows cannot make a Job."""
        j = self.jobs
        found = 0
        for job_id in ids:
            try:
                row = conn.execute(sa.select(*self._job_columns).where(j.c.id == job_id)).one()
                Job.from_tuple((*row, None), 0)
            except (TypeError, ValueError) as exc:
                keyed = conn.execute(
                    sa.select(j.c.queue, j.c["key"], j.c.key_seq).where(j.c.id == job_id)
                ).one()
                now = self.dialect.now()
                message = (
                    f"the row of job {job_id} cannot be read ({type(exc).__name__}: {exc}); it "
                    "was probably written by hand with a value its column cannot hold: fix the "
                    f"row, then requeue it (dbqueue dead requeue {job_id})"
                )
                with self.dialect.statements_together(conn):  # its death frees its key
                    conn.execute(
                        sa.update(j)
                        .where(j.c.id == job_id, j.c.status == Status.AVAILABLE)
                        .values(
                            status=Status.DEAD, message=message, finished_at=now, updated_at=now
                        )
                    )
                    if keyed[2] is not None:  # it headed its key's line (it was available)
                        self.release_key(conn, keyed[0], keyed[1], int(keyed[2]), job_id)
                found += 1
        return found

    def candidate_ids(
        self,
        conn: Connection,
        queue: str,
        limit: int,
        offset: int = 0,
        task: str | None = None,
    ) -> list[int]:
        """Ids of runnable jobs in claim order, without locking (lock-based strategies);
        ``task``: of that task only (a batch handler's gathering)."""
        stmt = self.statement(
            f"candidates:{task is not None}", lambda: self._candidates(task is not None)
        )
        params = {"queue": queue, "limit": limit, "offset": offset, "task": task}
        return [int(row[0]) for row in self.compiled(stmt).raw_rows(conn, params)]

    def locked_candidates(
        self,
        conn: Connection,
        queue: str,
        limit: int,
        offset: int,
        task: str | None,
        lock: Callable[[sa.ColumnElement], sa.ColumnElement],
        prefix: str = "",
    ) -> list[tuple[int, bool]]:
        """``candidate_ids`` and, in the same statement, ``lock(id)`` tried on each: (id,
        whether its lock was taken). The lock is in the select list over the LIMITed list (a
        derived table, materialised), so it is tried exactly once for each id returned.
        ``prefix``: what names the locks ``lock`` takes (the statement is built once per)."""

        def build() -> sa.Select:
            listed = self._candidates(task is not None).subquery("candidates")
            return sa.select(listed.c.id, lock(listed.c.id))

        stmt = self.statement(f"locked_candidates:{prefix}:{task is not None}", build)
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
        prefix: str,
        lock: Callable[[sa.ColumnElement], sa.ColumnElement],
    ) -> tuple[list[int], list[Job]] | None:
        """``locked_candidates`` and ``claim_ids`` in one statement, where the dialect can write
        in a WITH clause (else None): the ids whose locks were taken, and the jobs claimed.

        The window is a materialised CTE (its LIMIT applied before any lock is tried), the locks
        are tried in the select list of a second one, read in full by the final join, so each
        listed id's lock is tried exactly once; the UPDATE marks running those locked and still
        waiting. A locked id with no job (claimed and finished since the window was read) is
        the caller's to release."""
        if not self.dialect.writes_in_with:
            return None
        stmt = self.statement(f"claim:lock_window:{prefix}", lambda: self._lock_and_claim(lock))
        compiled = self.compiled(stmt)
        params = {"queue": queue, "limit": limit, "offset": offset, "worker_id": worker_id}
        rows = compiled.raw_rows(conn, params)
        locked = [int(row[0]) for row in rows if row[1]]
        read, order = self.statement(f"reader:{id(compiled)}", lambda: self._reader(compiled, 2))
        claimed = sorted((row[2:] for row in rows if row[2] is not None), key=order)
        return locked, self.admit(conn, [read(row, 0) for row in claimed])

    def _lock_and_claim(self, lock: Callable[[sa.ColumnElement], sa.ColumnElement]) -> sa.Select:
        j = self.jobs
        window = self._candidates(False).cte("window").prefix_with("MATERIALIZED")
        unflushed = self.dialect.commit_unflushed()
        locks = (
            sa.select(
                window.c.id,
                lock(window.c.id).label("taken"),
                *([] if unflushed is None else [unflushed.label("unflushed")]),
            )
            .cte("locks")
            .prefix_with("MATERIALIZED")
        )
        now = self.dialect.now()
        claimed = (
            sa.update(j)
            .where(
                j.c.id.in_(sa.select(locks.c.id).where(locks.c.taken)),
                self.dialect.unindexed(j.c.status) == Status.AVAILABLE,
                j.c.run_at <= now,
            )
            .values(self._running_values(now))
            .returning(*self._claim_columns(), j.c.started_at)
            .cte("claimed")
        )
        columns = [claimed.c[name] for name in ROW_FIELDS]
        return sa.select(locks.c.id, locks.c.taken, *columns).select_from(
            locks.outerjoin(claimed, claimed.c.id == locks.c.id)
        )

    def _candidates(self, of_task: bool) -> sa.Select:
        """The runnable ids in claim order, built once: the queue, the page (``limit``,
        ``offset``) and, ``of_task``, the task are parameters."""
        j = self.jobs
        task = [j.c.task == sa.bindparam("task", type_=j.c.task.type)] if of_task else []
        return (
            sa.select(j.c.id)
            .where(
                j.c.status == Status.AVAILABLE,
                j.c.queue == sa.bindparam("queue", type_=j.c.queue.type),
                j.c.run_at <= self.dialect.now(),
                *task,
            )
            .order_by(*self._claim_order)
            .limit(sa.bindparam("limit", type_=sa.Integer()))
            .offset(sa.bindparam("offset", type_=sa.Integer()))
        )

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
        (``Dialect.commit_unflushed``; the UPDATE may be a transaction of its own). Compiled
        once per number of ids, its rows read like a claim's (``row_reader``)."""
        size = len(ids)
        if not size:
            return []
        returning = bool(conn.dialect.update_returning)
        mark = self.compiled(
            self.statement(
                f"claim_ids:{due_only}:{returning}:{size}:{unflushed}",
                lambda: self._claim_ids(due_only, returning, size, unflushed),
            )
        )
        params = {"worker_id": worker_id, **dict(zip(id_names(size), ids, strict=True))}
        if returning:
            found = mark
        else:
            mark.rowcount(conn, params)
            found = self.compiled(
                self.statement(f"claimed_ids:{size}", lambda: self._claimed_ids(size))
            )
        read, order = self.statement(f"reader:{id(found)}", lambda: self._reader(found))
        rows = sorted(found.raw_rows(conn, params), key=order)
        return self.admit(conn, [read(row, 0) for row in rows])

    def _reader(
        self, found: CompiledStatement, skip: int = 0
    ) -> tuple[RowReader, Callable[[Any], tuple]]:
        """A claim statement's row reader, and the claim order of its raw rows (an UPDATE
        returns them in no set order), for rows less their first ``skip`` columns: the order's
        few columns converted on their own, since reading a lazy one from a Job would convert
        all of its row (``job.LAZY``)."""
        shifted = [(i - skip, p) for i, p in found.result_processors if i >= skip]
        processors = dict(shifted)
        columns = [ROW_FIELDS.index(name) for name in self._claim_key]

        def order(row: Any) -> tuple:
            return tuple(
                processors[i](row[i]) if i in processors and row[i] is not None else row[i]
                for i in columns
            )

        return row_reader(shifted), order

    def _claim_ids(self, due_only: bool, returning: bool, size: int, unflushed: bool) -> sa.Update:
        """claim_ids' UPDATE, built once per number of ids: the ids and the worker are
        parameters. ``unflushed``: ``commit_unflushed`` read once in its WHERE (an uncorrelated
        subquery), before any row it writes."""
        j = self.jobs
        now = self.dialect.now()
        due = [j.c.run_at <= now] if due_only else []
        setting = self.dialect.commit_unflushed() if unflushed else None
        if setting is not None:
            due.append(sa.select(setting).scalar_subquery().is_not(None))
        stmt = (
            sa.update(j)
            .where(
                self._id_list(size),
                self.dialect.unindexed(j.c.status) == Status.AVAILABLE,
                *due,
            )
            .values(self._running_values(now))
        )
        return stmt.returning(*self._claim_columns(), j.c.started_at) if returning else stmt

    def _running_values(self, now: sa.ColumnElement) -> dict[str, Any]:
        """What marking a locked job ``running`` writes (one attempt more), for both the
        one-statement claim and ``claim_ids``."""
        j = self.jobs
        return {
            "status": Status.RUNNING,
            "attempt": j.c.attempt + 1,
            "started_at": now,
            "first_attempt_at": sa.func.coalesce(j.c.first_attempt_at, now),
            "worker_id": sa.bindparam("worker_id", type_=j.c.worker_id.type),
            "updated_at": now,
        }

    def _claimed_ids(self, size: int) -> sa.Select:
        """Where UPDATE returns nothing: the jobs claim_ids just marked, read back."""
        j = self.jobs
        return sa.select(*self._claim_columns(), j.c.started_at).where(
            self._id_list(size),
            j.c.status == Status.RUNNING,
            j.c.worker_id == sa.bindparam("worker_id", type_=j.c.worker_id.type),
        )

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

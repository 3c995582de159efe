"""Cancellation in SQLAlchemy Core: waiting jobs cancelled at once, running jobs' requests kept
in a table of their own, the worker's record of a running job it stopped, and where the
requests are kept (the queue's own database, or the side database of
``Dialect.side_database_url``).

A running job's row may be locked for as long as its handler runs (a ``skip_locked`` claim holds
it in the batch transaction), so nothing here ever waits for a job's row lock: waiting jobs are
picked with ``FOR UPDATE SKIP LOCKED`` where the database has it (a row someone holds is
running, or about to), and a request for a running job is a row of the requests table.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dbqueue import dialects
from dbqueue.dialects import Dialect
from dbqueue.engine import catalog
from dbqueue.engine.keys import KeyLines
from dbqueue.engine.records import truncate
from dbqueue.engine.statements import Statements
from dbqueue.engine.unique import UniqueKeys
from dbqueue.job import Job, Status
from dbqueue.schema.tables import QueueTables, TableNames, cancels_table
from dbqueue.strategies.base import Fence

#: The message of a job cancelled before it ran.
CANCELLED_WAITING = "cancelled while waiting to run"


class Cancels:
    def __init__(self, sql: Statements, keys: KeyLines, unique: UniqueKeys) -> None:
        self.sql = sql
        self.keys = keys
        self.unique = unique
        self.dialect = sql.dialect

    def cancel_waiting(
        self,
        conn: Connection,
        ids: Sequence[int],
        held: Callable[[list[int]], set[int]] | None = None,
    ) -> list[int]:
        """Cancel those of ``ids`` that wait to run (due or scheduled) and that no transaction
        holds; returns them. Never waits for a row lock where the database has SKIP LOCKED: a
        row another transaction holds is left alone (a claim holds it: the job is running).
        ``held``, asked once the write lock is ours, names jobs a worker is stopping: their
        rolled-back batch shows them waiting, but that worker records their end."""
        free = list(ids)
        if not free:
            return []
        new = self.sql.new
        with self.sql.translate_errors():
            self.dialect.take_write_lock(conn, self.sql.jobs)
            if held is not None:
                stopping = held(free)
                free = [job_id for job_id in free if job_id not in stopping]
                if not free:
                    return []
            heads = self.keys.lock_lines(conn, free)
        if free and self.dialect.supports_skip_locked:
            with self.sql.translate_errors():
                free = list(conn.execute(new(catalog.jobs_waiting_unlocked, free)).scalars())
        if not free:
            return []
        with self.sql.translate_errors():
            stmt = new(catalog.jobs_cancel_waiting, free, CANCELLED_WAITING)
            changed = conn.execute(stmt).rowcount
        if changed != len(free):
            # Without row locks taken first, another writer may have got to some (a claim,
            # another cancel): the ones that are cancelled now are taken as ours.
            with self.sql.translate_errors():
                states = dict(conn.execute(new(catalog.jobs_states, free)).all())
            free = [job_id for job_id in free if states.get(job_id) == Status.CANCELLED]
        for job_id in free:
            if job_id in heads:  # it headed its key's line: the next job may run
                queue, key, place = heads[job_id]
                self.keys.release_key(conn, queue, key, place, job_id)
        if free:
            self.sql.announce_finished(conn, free)  # a caller of app.call may wait for one
            self.unique.release_finished(conn, free)
        return free

    def cancel_running(
        self,
        conn: Connection,
        job: Job,
        fence: Fence,
        message: str,
        requested_at: dt.datetime | None,
    ) -> int:
        """The worker's record of a running job it stopped on request: ``cancelled``, the
        attempt counted, no retry, no dead-letter job. Fenced like ``Outcomes.fail``; returns
        the rows changed (0: the job is no longer this claim's)."""
        stmt = self.sql.new(
            catalog.jobs_cancel_running, job, fence, truncate(message), requested_at
        )
        changed = conn.execute(stmt).rowcount
        if changed:
            self.keys.release_keys(conn, [job])
        if changed and job.awaited:
            self.sql.announce_finished(conn, [job.id])
        if changed and job.unique_key:
            self.unique.release_unique(conn, [(job.queue, job.unique_key, job.id)])
        return changed


class CancelRequestRows:
    """The requests table's statements (``<jobs>_cancels``, in the queue's database or in the
    side database of ``Dialect.side_database_url``)."""

    def __init__(self, table: sa.Table, dialect: Dialect) -> None:
        self.table = table
        self.dialect = dialect

    def add(self, conn: Connection, ids: Sequence[int]) -> None:
        """A request for each of ``ids`` that has none pending."""
        if not ids:
            return
        pending = self.pending(conn, ids)
        new = [{"job_id": job_id} for job_id in dict.fromkeys(ids) if job_id not in pending]
        if new:
            conn.execute(catalog.cancels_add(self.table, self.dialect), new)

    def pending(self, conn: Connection, ids: Sequence[int]) -> dict[int, dt.datetime]:
        """job id → when its (first) request was made, for those of ``ids`` that have one."""
        if not ids:
            return {}
        rows = conn.execute(catalog.cancels_pending(self.table, self.dialect, ids))
        return {int(job_id): requested_at for job_id, requested_at in rows}

    def listed(self, conn: Connection, limit: int) -> list[int]:
        """Job ids that have requests, oldest request first (for the purge's clean-up)."""
        rows = conn.execute(catalog.cancels_listed(self.table, self.dialect, limit))
        return [int(job_id) for job_id in rows.scalars()]

    def drop(self, conn: Connection, ids: Sequence[int]) -> int:
        """Delete the requests of ``ids`` (their jobs have ended, or were cancelled waiting)."""
        if not ids:
            return 0
        return conn.execute(catalog.cancels_drop(self.table, self.dialect, ids)).rowcount


# ---- where requests are kept --------------------------------------------------------------------
class TableRequests:
    """Requests in ``<jobs>_cancels`` of the queue's own database, written on the caller's
    connection: they commit (or roll back) with the caller's transaction."""

    separate = False

    def __init__(self, tables: QueueTables) -> None:
        self.table = tables.cancels

    def rows(self, conn: Connection) -> CancelRequestRows:
        return CancelRequestRows(self.table, dialects.for_sqlalchemy(conn.dialect))

    def add(self, conn: Connection, ids: Sequence[int]) -> None:
        self.rows(conn).add(conn, ids)

    def pending(self, conn: Connection, ids: Sequence[int]) -> dict[int, dt.datetime]:
        return self.rows(conn).pending(conn, ids)

    def drop(self, conn: Connection, ids: Sequence[int]) -> None:
        self.rows(conn).drop(conn, ids)

    def listed(self, conn: Connection, limit: int) -> list[int]:
        return self.rows(conn).listed(conn, limit)

    def take(self, ids: Sequence[int]) -> None:
        """A worker is stopping these jobs. Here their rows show it (``running``, or locked by
        the batch), so nothing is kept."""

    def consume_taken(self, ids: Sequence[int]) -> set[int]:
        """Those of ``ids`` a worker took a request for (see ``take``); none here."""
        return set()

    def close(self) -> None:
        """Nothing of its own to release."""


class SideDatabaseRequests(TableRequests):
    """Requests in a side database (SQLite's file beside the queue's), each call in a short
    transaction of its own whatever ``conn`` is: they take effect at once, outside the caller's
    transaction. The table is created on first use."""

    separate = True

    def __init__(self, url: sa.engine.URL, names: TableNames) -> None:
        self.url = url
        metadata = sa.MetaData()
        self.table = cancels_table(metadata, dataclasses.replace(names, schema=None))
        self.taken = taken_table(metadata, self.table.name)
        self._engine: Engine | None = None
        self._lock = threading.Lock()

    def engine(self) -> Engine:
        with self._lock:
            if self._engine is None:
                engine = dialects.create_engine(self.url, pool_size=1, max_overflow=4)
                with engine.begin() as conn:
                    conn.execute(sa.schema.CreateTable(self.table, if_not_exists=True))
                    conn.execute(sa.schema.CreateTable(self.taken, if_not_exists=True))
                    for index in self.table.indexes:
                        conn.execute(sa.schema.CreateIndex(index, if_not_exists=True))
                self._engine = engine
            return self._engine

    def _writing(self) -> Any:
        # BEGIN IMMEDIATE: a read-then-write transaction that waits its turn for the lock.
        return self.engine().execution_options(**{dialects.WRITE_INTENT: True}).begin()

    def add(self, conn: Connection | None, ids: Sequence[int]) -> None:
        if ids:
            with self._writing() as own:
                self.rows(own).add(own, ids)

    def pending(self, conn: Connection | None, ids: Sequence[int]) -> dict[int, dt.datetime]:
        if not ids:
            return {}
        with self.engine().connect() as own:
            return self.rows(own).pending(own, ids)

    def drop(self, conn: Connection | None, ids: Sequence[int]) -> None:
        if ids:
            with self._writing() as own:
                self.rows(own).drop(own, ids)
                own.execute(catalog.cancels_drop(self.taken, self.rows(own).dialect, ids))

    def take(self, ids: Sequence[int]) -> None:
        """Mark these jobs' requests taken by the worker about to stop them, before it does:
        once their batch rolls back they look waiting, and a ``cancel`` call that then gets
        the write lock must leave their end to that worker (which records why it stopped
        them) instead of cancelling them as waiting jobs."""
        if ids:
            with self._writing() as own:
                dialect = self.rows(own).dialect
                own.execute(catalog.cancels_drop(self.taken, dialect, ids))
                own.execute(catalog.cancels_take(self.taken, dialect), [{"job_id": i} for i in ids])

    def consume_taken(self, ids: Sequence[int]) -> set[int]:
        """Those of ``ids`` marked taken, unmarking them: a mark left by a worker that died
        before recording its job's end then misleads at most one call (the request itself
        stays, and stops the job when it next runs long enough)."""
        if not ids:
            return set()
        with self._writing() as own:
            dialect = self.rows(own).dialect
            taken = own.execute(catalog.cancels_taken_among(self.taken, dialect, ids)).scalars()
            found = {int(job_id) for job_id in taken}
            if found:
                own.execute(catalog.cancels_drop(self.taken, dialect, ids))
        return found

    def listed(self, conn: Connection | None, limit: int) -> list[int]:
        with self.engine().connect() as own:
            return self.rows(own).listed(own, limit)

    def close(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None


RequestStore = TableRequests


def taken_table(metadata: sa.MetaData, cancels_name: str) -> sa.Table:
    """The side database's marks of requests a worker has taken (``SideDatabaseRequests.take``):
    created on first use like the requests table, in the side file only."""
    return sa.Table(
        f"{cancels_name}_taken",
        metadata,
        sa.Column("job_id", sa.Integer(), primary_key=True, autoincrement=False),
    )


def request_store(side_url: sa.engine.URL | None, tables: QueueTables) -> RequestStore:
    """Where a queue's cancel requests live: beside its jobs, or in the side database the
    database module asks for (``Dialect.side_database_url``: SQLite's file beside its own)."""
    if side_url is None:
        return TableRequests(tables)
    return SideDatabaseRequests(side_url, tables.names)

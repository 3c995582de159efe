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
from dbqueue.engine.keys import Keys
from dbqueue.engine.records import truncate
from dbqueue.engine.unique import UniqueRelease
from dbqueue.job import PUBLICATION_MARKER, Job, Status
from dbqueue.schema.tables import QueueTables, TableNames, cancels_table
from dbqueue.schema.types import UtcDateTime

#: The message of a job cancelled before it ran.
CANCELLED_WAITING = "cancelled while waiting to run"


class Cancels(UniqueRelease, Keys):
    def job_states(self, conn: Connection, ids: Sequence[int]) -> dict[int, str]:
        """The committed status of each of ``ids`` that exists; never waits for a lock."""
        if not ids:
            return {}
        j = self.jobs
        with self.translate_errors():
            rows = conn.execute(sa.select(j.c.id, j.c.status).where(j.c.id.in_(list(ids))))
            return {int(job_id): status for job_id, status in rows}

    def publication_jobs(self, conn: Connection, publication_id: int) -> list[int]:
        """The jobs of one publication: its deliveries and their dead-letter jobs (not the
        publication's own record, which is finished from the start)."""
        j = self.jobs
        with self.translate_errors():
            rows = conn.execute(
                sa.select(j.c.id)
                .where(
                    j.c.publication_id == publication_id,
                    j.c.subscription_id != PUBLICATION_MARKER,
                )
                .order_by(j.c.id)
            )
            return [int(job_id) for job_id in rows.scalars()]

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
        j = self.jobs
        free = list(ids)
        if not free:
            return []
        with self.translate_errors():
            self.dialect.take_write_lock(conn, j)
            if held is not None:
                stopping = held(free)
                free = [job_id for job_id in free if job_id not in stopping]
                if not free:
                    return []
            heads = self.lock_lines(conn, free)
        if free and self.dialect.supports_skip_locked:
            with self.translate_errors():
                free = list(
                    conn.execute(
                        sa.select(j.c.id)
                        .where(j.c.id.in_(free), j.c.status.in_(Status.WAITING))
                        .with_for_update(skip_locked=True)
                    ).scalars()
                )
        if not free:
            return []
        now = self.dialect.now()
        with self.translate_errors():
            changed = conn.execute(
                sa.update(j)
                .where(j.c.id.in_(free), self.dialect.unindexed(j.c.status).in_(Status.WAITING))
                .values(
                    status=Status.CANCELLED,
                    message=CANCELLED_WAITING,
                    finished_at=now,
                    cancel_requested_at=now,
                    updated_at=now,
                )
            ).rowcount
        if changed != len(free):
            # Without row locks taken first, another writer may have got to some (a claim,
            # another cancel): the ones that are cancelled now are taken as ours.
            states = self.job_states(conn, free)
            free = [job_id for job_id in free if states.get(job_id) == Status.CANCELLED]
        for job_id in free:
            if job_id in heads:  # it headed its key's line: the next job may run
                queue, key, place = heads[job_id]
                self.release_key(conn, queue, key, place, job_id)
        if free:
            self.announce_finished(conn, free)  # a caller of app.call may wait for one
            self.release_finished(conn, free)
        return free

    def cancel_running(
        self,
        conn: Connection,
        job: Job,
        message: str,
        *,
        requested_at: dt.datetime | None,
        attempt_increment: int,
        expected_status: str,
        worker_id: str,
        claimed_by: str | None = None,
        same_attempt: bool = False,
    ) -> int:
        """The worker's record of a running job it stopped on request: ``cancelled``, the
        attempt counted, no retry, no dead-letter job. Fenced like ``fail()``; returns the rows
        changed (0: the job is no longer this worker's)."""
        j = self.jobs
        now = self.dialect.now()
        guard = [j.c.id == job.id, j.c.status == expected_status, *self._claimed_by(claimed_by)]
        if same_attempt:
            guard.append(j.c.attempt == job.attempt - attempt_increment)
        values: dict[str, Any] = {
            "status": Status.CANCELLED,
            "attempt": j.c.attempt + attempt_increment,
            "message": truncate(message),
            "started_at": job.started_at,
            "first_attempt_at": sa.func.coalesce(j.c.first_attempt_at, job.started_at),
            "finished_at": now,
            "cancel_requested_at": now if requested_at is None else requested_at,
            "updated_at": now,
            "worker_id": worker_id,
        }
        changed = conn.execute(sa.update(j).where(*guard).values(values)).rowcount
        if changed:
            self.release_keys(conn, [job])
        if changed and job.awaited:
            self.announce_finished(conn, [job.id])
        if changed and job.unique_key:
            self.release_unique(conn, [(job.queue, job.unique_key, job.id)])
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
            conn.execute(sa.insert(self.table).values(requested_at=self.dialect.now()), new)

    def pending(self, conn: Connection, ids: Sequence[int]) -> dict[int, dt.datetime]:
        """job id → when its (first) request was made, for those of ``ids`` that have one."""
        if not ids:
            return {}
        t = self.table
        rows = conn.execute(
            sa.select(t.c.job_id, sa.type_coerce(sa.func.min(t.c.requested_at), UtcDateTime()))
            .where(t.c.job_id.in_(list(ids)))
            .group_by(t.c.job_id)
        )
        return {int(job_id): requested_at for job_id, requested_at in rows}

    def listed(self, conn: Connection, limit: int) -> list[int]:
        """Job ids that have requests, oldest request first (for the purge's clean-up)."""
        t = self.table
        rows = conn.execute(
            sa.select(t.c.job_id).group_by(t.c.job_id).order_by(sa.func.min(t.c.id)).limit(limit)
        )
        return [int(job_id) for job_id in rows.scalars()]

    def drop(self, conn: Connection, ids: Sequence[int]) -> int:
        """Delete the requests of ``ids`` (their jobs have ended, or were cancelled waiting)."""
        if not ids:
            return 0
        return conn.execute(
            sa.delete(self.table).where(self.table.c.job_id.in_(list(ids)))
        ).rowcount


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
                own.execute(sa.delete(self.taken).where(self.taken.c.job_id.in_(list(ids))))

    def take(self, ids: Sequence[int]) -> None:
        """Mark these jobs' requests taken by the worker about to stop them, before it does:
        once their batch rolls back they look waiting, and a ``cancel`` call that then gets
        the write lock must leave their end to that worker (which records why it stopped
        them) instead of cancelling them as waiting jobs."""
        if ids:
            with self._writing() as own:
                own.execute(sa.delete(self.taken).where(self.taken.c.job_id.in_(list(ids))))
                own.execute(sa.insert(self.taken), [{"job_id": job_id} for job_id in ids])

    def consume_taken(self, ids: Sequence[int]) -> set[int]:
        """Those of ``ids`` marked taken, unmarking them: a mark left by a worker that died
        before recording its job's end then misleads at most one call (the request itself
        stays, and stops the job when it next runs long enough)."""
        if not ids:
            return set()
        where = self.taken.c.job_id.in_(list(ids))
        with self._writing() as own:
            found = {
                int(job_id)
                for job_id in own.execute(sa.select(self.taken.c.job_id).where(where)).scalars()
            }
            if found:
                own.execute(sa.delete(self.taken).where(where))
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

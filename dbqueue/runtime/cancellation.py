"""Cancelling jobs without ever waiting for a running job: where requests are kept, and the steps
of one ``app.cancel`` call.

A waiting job (available, due or scheduled) is cancelled at once, in the caller's transaction.
A running job cannot be: its row may be locked by the batch running it for as long as its
handler runs (``skip_locked`` claims hold it in the batch transaction), so the call leaves a
request in the requests table instead, which the worker running the job polls (see
``worker/cancel_poller.py``). Where the database has a single write lock that the running batch
holds (SQLite), even that table cannot be written while the job runs: requests then go to a side
database (``Dialect.side_database_url``), written before the caller's transaction waits for the
lock — which the stopped job's batch then releases.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dbqueue import dialects
from dbqueue.engine import CancelRequestRows
from dbqueue.errors import ConfigurationError
from dbqueue.job import Status
from dbqueue.schema.tables import QueueTables, TableNames, cancels_table

if TYPE_CHECKING:
    import datetime as dt

    from dbqueue.runtime.context import RuntimeContext

#: What ``app.cancel`` reports per job id.
CANCELLED = "cancelled"
REQUESTED = "cancel requested"
NOT_FOUND = "not found"


def already(status: str) -> str:
    """The report for a job that had finished: ``already succeeded`` / ``dead`` / ``cancelled``."""
    return f"already {status}"


def job_ids(ids: int | Iterable[int]) -> list[int]:
    """One id or an iterable of them, checked: whole numbers, in order, without repeats."""
    single = isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable)
    found: list[Any] = [ids] if single else list(ids)
    for job_id in found:
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
            raise ConfigurationError(
                f"job id {job_id!r} is not a job id: pass a whole number above 0, or a list of them"
            )
    return list(dict.fromkeys(found))


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


def request_store(context: RuntimeContext) -> RequestStore:
    """Where this queue's cancel requests live (the database decides; see the module doc)."""
    side = context.dialect_class().side_database_url(sa.engine.make_url(context.url))
    if side is None:
        return TableRequests(context.tables)
    return SideDatabaseRequests(side, context.names)


def forget_ended(context: RuntimeContext, conn: Connection, limit: int = 1000) -> int:
    """Delete the requests of jobs that ended (or were purged) before a worker saw them: the
    purge routine's clean-up. Returns how many jobs' requests went."""
    store = context.cancel_requests()
    ids = store.listed(conn, limit)
    states = context.queue_engine(conn).job_states(conn, ids)
    ended = [job_id for job_id in ids if states.get(job_id) not in Status.PENDING]
    store.drop(conn, ended)
    return len(ended)


# ---- one app.cancel call ----------------------------------------------------------------------
class CancelCall:
    """The steps of cancelling ``ids``: ``post_early`` (only where requests are kept apart:
    before the caller's transaction waits for the write lock), ``run`` on the caller's
    connection, then ``settle``."""

    def __init__(self, context: RuntimeContext, ids: Sequence[int]) -> None:
        self.context = context
        self.ids = list(ids)
        self.store = context.cancel_requests()
        self.before: dict[int, str] | None = None
        self.early: set[int] = set()
        self._settled: list[int] = []

    def post_early(self, engine: Engine) -> None:
        """Read the jobs' states without waiting for anything, and ask every worker to stop
        any of them it runs: on a single-writer database a running job cannot be told apart
        from a waiting one, and the write lock the caller needs is held by its batch."""
        with engine.connect() as conn:
            self.before = self.context.queue_engine(conn).job_states(conn, self.ids)
        self.early = {i for i in self.ids if self.before.get(i) in Status.PENDING}
        self.store.add(None, sorted(self.early))

    def run(self, conn: Connection) -> dict[int, str]:
        """Cancel the waiting jobs and ask for the running ones, on ``conn`` (the caller's
        transaction); returns job id → what happened."""
        engine = self.context.queue_engine(conn)
        before = self.before if self.before is not None else engine.job_states(conn, self.ids)
        waiting = [i for i in self.ids if before.get(i) in Status.WAITING]
        cancelled = set(engine.cancel_waiting(conn, waiting, held=self._being_stopped))
        after = engine.job_states(conn, [i for i in self.ids if i not in cancelled])
        report: dict[int, str] = {}
        running: list[int] = []
        for job_id in self.ids:
            status = after.get(job_id)
            if job_id in cancelled or (status == Status.CANCELLED and job_id in self.early):
                report[job_id] = CANCELLED  # (or its worker stopped it on the early request)
            elif status is None:
                report[job_id] = NOT_FOUND
            elif status in Status.PENDING:
                # Held by a claim (skip_locked shows it available) or marked running.
                report[job_id] = REQUESTED
                running.append(job_id)
            else:
                report[job_id] = already(status)
        ended = [i for i in self.ids if i not in running]
        if self.store.separate:
            self._settled = ended
        else:
            self.store.add(conn, running)
            self.store.drop(conn, ended)  # requests left by earlier calls for jobs now over
        return report

    def _being_stopped(self, ids: list[int]) -> set[int]:
        """Asked with the write lock held: which of ``ids`` a worker has taken the early
        request of (it stopped them; their batch rolled back; it records their end)."""
        return self.store.consume_taken([i for i in ids if i in self.early])

    def settle(self) -> None:
        """Withdraw the early requests of jobs that were not running after all."""
        if self._settled:
            self.store.drop(None, self._settled)

    def withdraw(self) -> None:
        """The call failed: withdraw its early requests (best effort; a worker may have seen
        one already)."""
        if self.early:
            self.store.drop(None, sorted(self.early))

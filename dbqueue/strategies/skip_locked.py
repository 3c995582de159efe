"""``SELECT … FOR UPDATE SKIP LOCKED`` (PostgreSQL, MySQL ≥ 8.0.1, MariaDB ≥ 10.6).

The claimed rows stay locked by the batch transaction while the handlers run in it, so the
handlers' writes and the jobs' completion commit together, and a worker that dies takes its
transaction — and its claim — with it (and a limited queue's slot, a row locked the same way).
A plain SELECT … FOR UPDATE is used instead of an ``UPDATE … SET status = 'running'``: the
running state would never be visible outside the transaction anyway, and skipping that write
saves a row version per job.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue.dialects import Dialect
from dbqueue.errors import StrategyNotSupportedError
from dbqueue.job import Job
from dbqueue.strategies.advisory_lock import DatabaseLocks
from dbqueue.strategies.base import ClaimStatements, ClaimStrategy
from dbqueue.strategies.locks import LockBackend


def skip_locked(stmt: sa.Select) -> sa.Select:
    """This strategy's locking: the rows it reads, locked, those another holds skipped."""
    return stmt.with_for_update(skip_locked=True)


class SkipLockedStrategy(ClaimStrategy):
    name = "skip_locked"
    claims_in_transaction = True

    @classmethod
    def check_supported(cls, dialect: Dialect) -> None:
        if not dialect.supports_skip_locked:
            raise StrategyNotSupportedError(
                f"strategy skip_locked is not available: {dialect.skip_locked_unsupported_reason()}"
            )

    def claim(
        self, conn: Connection, claims: ClaimStatements, queue: str, limit: int, worker_id: str
    ) -> list[Job]:
        stmt = claims.runnable(locking=skip_locked)
        return claims.fetch_jobs(conn, stmt, queue, limit, self.attempt_increment)

    def claim_limited(
        self,
        conn: Connection,
        claims: ClaimStatements,
        queue: str,
        limit: int,
        worker_id: str,
        slots: int,
    ) -> list[Job] | None:
        """The slot is a row of the slots table, locked like the jobs: ``FOR UPDATE SKIP
        LOCKED`` in the batch transaction. It is held until that transaction ends — the job's
        outcome commits, or the worker dies and the database rolls it back, freeing the slot
        and the job together. One slot, so one job. Its holder is written on the row: a job
        run outside the transaction, under a lease, keeps the slot while it runs."""
        stmt = claims.free_slot(locking=skip_locked)
        slot = claims.take_slot(conn, stmt, queue, slots)
        if slot is None:
            return None
        jobs = self.claim(conn, claims, queue, 1, worker_id)
        if jobs:
            claims.record_slot(conn, queue, slot, jobs[0].id, worker_id)
        return jobs

    def claim_task(
        self,
        conn: Connection,
        claims: ClaimStatements,
        queue: str,
        task: str,
        limit: int,
        worker_id: str,
        exclude: list[Job],
    ) -> list[Job]:
        ids = [job.id for job in exclude]
        stmt = skip_locked(claims.runnable_of_task(queue, task, limit, ids))
        return claims.fetch_waiting(conn, stmt, self.attempt_increment)

    @property
    def liveness_locks(self) -> LockBackend | None:
        """Claims held in the transaction never commit ``running``: any such row comes from a
        lock-based worker, whose per-job lock the database's named locks can test."""
        return DatabaseLocks(self.dialect) if self.dialect.supports_named_locks else None

    def claim_ids(
        self, conn: Connection, claims: ClaimStatements, ids: list[int], worker_id: str
    ) -> list[Job]:
        stmt = skip_locked(claims.waiting(ids))
        return claims.fetch_waiting(conn, stmt, self.attempt_increment)

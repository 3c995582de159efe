"""SQLite: the database's single write lock is the claim.

SQLite has no SKIP LOCKED (no row locks at all), and SQLAlchemy would silently drop a
``with_for_update()``. Instead every dbqueue transaction on SQLite starts with BEGIN IMMEDIATE
(see dialects/sqlite.py), so the batch transaction holds the write lock from the claim until the
handlers' writes and the completion commit: other workers wait (busy_timeout) rather than read
the same rows. A killed worker's lock and uncommitted writes vanish with its process.
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from dbqueue.dialects import Dialect
from dbqueue.errors import StrategyNotSupportedError
from dbqueue.job import Job
from dbqueue.strategies.base import ClaimStatements, ClaimStrategy


class SQLiteStrategy(ClaimStrategy):
    name = "sqlite"
    claims_in_transaction = True
    # The claim holds the one write lock: waiting with it would hold up every enqueue.
    waits_holding_claims = False

    @classmethod
    def check_supported(cls, dialect: Dialect) -> None:
        if not dialect.single_writer:
            raise StrategyNotSupportedError(
                f"strategy sqlite relies on the database admitting one writer at a time, which "
                f"{dialect.server_description} does not: use --strategy {dialect.default_strategy}"
            )

    def claim(
        self, conn: Connection, claims: ClaimStatements, queue: str, limit: int, worker_id: str
    ) -> list[Job]:
        return claims.fetch_jobs(conn, claims.runnable(), queue, limit, self.attempt_increment)

    def claim_limited(
        self,
        conn: Connection,
        claims: ClaimStatements,
        queue: str,
        limit: int,
        worker_id: str,
        slots: int,
    ) -> list[Job] | None:
        """The batch transaction holds the database's one write lock from the claim to the
        outcome's commit, so one batch runs at a time in the whole database, its jobs one
        after another. A job run outside the transaction, under a lease, outlives the lock: so
        the claim takes a slot no leased job holds (the slots table), and writes the job on it.
        A killed worker's lock vanishes with its process; its leased job's slot frees once its
        lease ends and rescue retries the job."""
        slot = claims.take_slot(conn, claims.free_slot(), queue, slots)
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
        stmt = claims.runnable_of_task(queue, task, limit, [job.id for job in exclude])
        return claims.fetch_waiting(conn, stmt, self.attempt_increment)

    def claim_ids(
        self, conn: Connection, claims: ClaimStatements, ids: list[int], worker_id: str
    ) -> list[Job]:
        return claims.fetch_waiting(conn, claims.waiting(ids), self.attempt_increment)

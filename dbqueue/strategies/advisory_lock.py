"""Advisory (named) locks: the seed's claim method (PostgreSQL, MySQL/MariaDB).

A worker lists runnable jobs, takes a connection-scoped named lock on each it wants
(``pg_try_advisory_lock`` / ``GET_LOCK(name, 0)``), marks them ``running`` and commits, then runs
the handlers in a second transaction that also marks them succeeded. The lock, not a row lock,
says the job is taken: it is visible as ``running`` while it runs, and when a worker dies its
connection — and so its locks — die with it; the rescue routine then finds ``running`` jobs whose
lock anyone can take and schedules them for retry.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection

from ..config import Settings
from ..dialects import Dialect
from ..errors import StrategyNotSupportedError
from ..job import Job
from ..locks import DatabaseLocks, LockBackend, job_lock_name
from .base import ClaimStrategy

if TYPE_CHECKING:
    from ..engine import QueueEngine

log = logging.getLogger("dbqueue.strategies")

# Workers list the same runnable jobs at the same moment; listing a few times more than they
# want lets each find unlocked ones, and up to PAGES pages are tried before giving up a round.
OVERFETCH = 4
MAX_CANDIDATES = 200
PAGES = 3


class LockClaimStrategy(ClaimStrategy):
    """Claims made exclusive by a named lock per job (database locks or the lock server)."""

    claims_in_transaction = False

    def __init__(self, dialect: Dialect, locks: LockBackend, settings: Settings | None) -> None:
        super().__init__(dialect, settings)
        self.locks = locks

    def claim(
        self, conn: Connection, engine: QueueEngine, queue: str, limit: int, worker_id: str
    ) -> list[Job]:
        namespace = engine.tables.names.qualified_jobs
        wanted = min(limit * OVERFETCH, MAX_CANDIDATES)
        held: list[str] = []
        try:
            with conn.begin():
                for page in range(PAGES):
                    ids = engine.candidate_ids(conn, queue, wanted, offset=page * wanted)
                    if not ids:
                        return []
                    names = {job_id: job_lock_name(namespace, job_id) for job_id in ids}
                    taken = self.locks.try_acquire(conn, list(names.values()))
                    locked = [job_id for job_id, ok in zip(ids, taken, strict=True) if ok]
                    held = [names[i] for i in locked]
                    if locked:
                        break
                    if len(ids) < wanted:
                        return []
                else:
                    return []
                keep, extra = locked[:limit], locked[limit:]
                self.locks.release(conn, [names[i] for i in extra])
                held = [names[i] for i in keep]
                jobs = engine.claim_ids(conn, keep, worker_id)
        except BaseException:
            # The claim failed — possibly after its COMMIT reached the database: let go of the
            # locks, so that rescue can retry whatever was marked running. (Database locks go
            # with the broken connection anyway; the lock server's would be held for ever.)
            self._let_go(conn, held)
            raise
        gone = set(keep) - {job.id for job in jobs}
        self.locks.release(conn, [names[i] for i in gone])
        return jobs

    def claim_ids(
        self, conn: Connection, engine: QueueEngine, ids: list[int], worker_id: str
    ) -> list[Job]:
        namespace = engine.tables.names.qualified_jobs
        names = {job_id: job_lock_name(namespace, job_id) for job_id in ids}
        held: list[str] = []
        try:
            with conn.begin():
                taken = self.locks.try_acquire(conn, list(names.values()))
                locked = [job_id for job_id, ok in zip(ids, taken, strict=True) if ok]
                held = [names[i] for i in locked]
                jobs = engine.claim_ids(conn, locked, worker_id, due_only=False) if locked else []
        except BaseException:
            self._let_go(conn, held)  # as in claim(): rescue retries what was marked running
            raise
        self.locks.release(conn, [names[i] for i in set(locked) - {job.id for job in jobs}])
        return jobs

    def _let_go(self, conn: Connection, names: list[str]) -> None:
        try:
            self.locks.release(conn, names)
        except Exception:  # the connection that failed may be what holds them: they die with it
            log.debug("releasing %d lock(s) after a failed claim failed", len(names), exc_info=True)

    def release(self, conn: Connection, engine: QueueEngine, jobs: list[Job]) -> None:
        namespace = engine.tables.names.qualified_jobs
        self.locks.release(conn, [job_lock_name(namespace, job.id) for job in jobs])

    def release_abandoned(self, engine: QueueEngine, jobs: list[Job], thread_id: int) -> None:
        namespace = engine.tables.names.qualified_jobs
        names = [job_lock_name(namespace, job.id) for job in jobs]
        self.locks.release_for_thread(thread_id, names)

    def holds(self, conn: Connection, engine: QueueEngine, jobs: list[Job]) -> bool:
        namespace = engine.tables.names.qualified_jobs
        return self.locks.holding(conn, [job_lock_name(namespace, job.id) for job in jobs])

    @property
    def liveness_locks(self) -> LockBackend:
        return self.locks


class AdvisoryLockStrategy(LockClaimStrategy):
    name = "advisory_lock"

    def __init__(self, dialect: Dialect, settings: Settings | None = None) -> None:
        super().__init__(dialect, DatabaseLocks(dialect), settings)

    @classmethod
    def check_supported(cls, dialect: Dialect) -> None:
        if not dialect.supports_named_locks:
            raise StrategyNotSupportedError(
                f"strategy advisory_lock is not available: "
                f"{dialect.named_locks_unsupported_reason()}; use --strategy "
                f"{dialect.default_strategy}"
            )

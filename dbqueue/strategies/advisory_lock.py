"""Advisory (named) locks: the seed's claim method (PostgreSQL, MySQL/MariaDB).

A worker lists runnable jobs, takes a connection-scoped named lock on each it wants
(``pg_try_advisory_lock`` / ``GET_LOCK(name, 0)``), marks them ``running`` and commits, then runs
the handlers in a second transaction that also marks them succeeded. The lock, not a row lock,
says the job is taken: it is visible as ``running`` while it runs, and when a worker dies its
connection — and so its locks — die with it; the rescue routine then finds ``running`` jobs whose
lock anyone can take and schedules them for retry.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue.config import Settings
from dbqueue.dialects import Dialect
from dbqueue.errors import StrategyNotSupportedError
from dbqueue.job import Job
from dbqueue.strategies.base import ClaimStatements, ClaimStrategy
from dbqueue.strategies.locks import LockBackend, job_lock_name, job_lock_prefix, slot_lock_name

log = logging.getLogger("dbqueue.strategies")

# Workers list the same runnable jobs at the same moment; listing a few times more than they
# want lets each find unlocked ones, and up to PAGES pages are tried before giving up a round.
OVERFETCH = 4
MAX_CANDIDATES = 200
PAGES = 3


class DatabaseLocks(LockBackend):
    """The database's advisory locks, held by the session of ``conn``.

    Every lock is tried in the select list of one statement, so each is evaluated exactly once
    (a lock function in a WHERE clause may be evaluated for rows the planner later discards,
    leaving locks nobody knows about).
    """

    releases_in_transaction = True

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        #: prefix → its lock expression builder: asked on every claim, built once.
        self._named_by: dict[str, Callable[[sa.ColumnElement], sa.ColumnElement] | None] = {}

    def try_acquire(self, conn: Connection, names: Sequence[str]) -> list[bool]:
        if not names:
            return []
        row = _execute(conn, sa.select(*(self.dialect.try_lock(n) for n in names)))
        return [bool(value) for value in row]

    def release(self, conn: Connection, names: Sequence[str]) -> None:
        if names:
            _execute(conn, sa.select(*(self.dialect.unlock(n) for n in names)))

    def try_acquire_named_by(
        self, prefix: str
    ) -> Callable[[sa.ColumnElement], sa.ColumnElement] | None:
        if prefix not in self._named_by:
            self._named_by[prefix] = self.dialect.try_lock_named_by(prefix)
        return self._named_by[prefix]

    def release_statement(self, prefix: str) -> sa.Select | None:
        return self.dialect.unlock_named_by(prefix)


def _execute(conn: Connection, stmt: sa.Select) -> sa.Row:
    """Session-level locks outlive transactions: run inside the caller's transaction if there is
    one, else in a short one of their own (never leaving an autobegun transaction open)."""
    if conn.in_transaction():
        return conn.execute(stmt).one()
    with conn.begin():
        return conn.execute(stmt).one()


class LockClaimStrategy(ClaimStrategy):
    """Claims made exclusive by a named lock per job (database locks or the lock server)."""

    claims_in_transaction = False

    def __init__(self, dialect: Dialect, locks: LockBackend, settings: Settings | None) -> None:
        super().__init__(dialect, settings)
        self.locks = locks
        #: job id → the slot lock its claim took (jobs of limited queues), until released.
        self._slot_locks: dict[int, str] = {}
        #: worker thread id → its window among the candidates (see ``_lock_candidates``).
        self._windows: dict[str, int] = {}
        self._mutex = threading.Lock()

    def claim(
        self, conn: Connection, claims: ClaimStatements, queue: str, limit: int, worker_id: str
    ) -> list[Job]:
        return self._claim(conn, claims, queue, limit, worker_id, None) or []

    def claim_limited(
        self,
        conn: Connection,
        claims: ClaimStatements,
        queue: str,
        limit: int,
        worker_id: str,
        slots: int,
    ) -> list[Job] | None:
        """The slot is a named lock per (queue, slot), taken like the jobs' and held until the
        job's outcome has committed (``release``). A dead worker's connection takes it along
        at once, while its job waits for rescue. The holder is written on the slot's row in
        the claim's transaction, for monitoring. One slot, so one job."""
        return self._claim(conn, claims, queue, 1, worker_id, slots)

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
        """The jobs already claimed are committed ``running``: no candidate list has them."""
        return self._claim(conn, claims, queue, limit, worker_id, None, task) or []

    def _claim(
        self,
        conn: Connection,
        claims: ClaimStatements,
        queue: str,
        limit: int,
        worker_id: str,
        slots: int | None,
        task: str | None = None,
    ) -> list[Job] | None:
        namespace = claims.namespace
        held: list[str] = []
        try:
            with self._locking(conn, slots is None and task is None):
                taken = self._lock_jobs(
                    conn, claims, queue, limit, worker_id, slots, task, namespace, held
                )
                if taken is None:
                    return None
                slot, keep, names, jobs = taken
                if jobs is None:
                    jobs = self._mark(conn, claims, queue, keep, worker_id, slot)
        except BaseException:
            # The claim failed — possibly after its COMMIT reached the database: let go of the
            # locks, so that rescue can retry whatever was marked running. (Database locks go
            # with the broken connection anyway; the lock server's would be held for ever.)
            self._let_go(conn, held)
            raise
        gone = [names[i] for i in set(keep) - {job.id for job in jobs}]
        if slot is not None:
            if jobs:
                with self._mutex:
                    self._slot_locks[jobs[0].id] = slot[1]
            else:
                gone.append(slot[1])
        self.locks.release(conn, gone)
        return jobs

    def _locking(self, conn: Connection, alone: bool) -> contextlib.AbstractContextManager[Any]:
        """The transaction the locks are taken in: the claim's own — each statement committing
        on its own where the driver can, when there is no slot to record (``alone``): the
        statements need no common transaction, as the locks outlive commits and the mark is a
        compare-and-set, and the mark's commit stays unflushed (``claim_ids``)."""
        if alone:
            return self.dialect.one_statement_transaction(conn)
        return conn.begin()

    def _lock_jobs(
        self,
        conn: Connection,
        claims: ClaimStatements,
        queue: str,
        limit: int,
        worker_id: str,
        slots: int | None,
        task: str | None,
        namespace: str,
        held: list[str],
    ) -> tuple[tuple[int, str] | None, list[int], dict[int, str], list[Job] | None] | None:
        """Take a slot (limited queues) and the jobs' locks: (slot, ids locked, lock names by
        id, jobs already claimed or None); None when every slot is taken."""
        slot: tuple[int, str] | None = None
        if slots is not None:
            slot = self._take_slot(conn, namespace, queue, slots)
            if slot is None:
                return None
            held.append(slot[1])
        if slot is None and task is None:
            claimed = self._lock_and_claim(conn, claims, queue, limit, namespace, held, worker_id)
            if claimed is not None:
                return slot, *claimed
        keep, names = self._lock_candidates(
            conn, claims, queue, limit, namespace, held, task, worker_id, slot is not None
        )
        return slot, keep, names, None

    def _mark(
        self,
        conn: Connection,
        claims: ClaimStatements,
        queue: str,
        keep: list[int],
        worker_id: str,
        slot: tuple[int, str] | None,
    ) -> list[Job]:
        """Mark the locked jobs running (and record the slot's holder)."""
        jobs = claims.claim_ids(conn, keep, worker_id, unflushed=True) if keep else []
        if slot is not None and jobs:
            claims.record_slot(conn, queue, slot[0], jobs[0].id, worker_id)
        return jobs

    def _lock_candidates(
        self,
        conn: Connection,
        claims: ClaimStatements,
        queue: str,
        limit: int,
        namespace: str,
        held: list[str],
        task: str | None = None,
        worker_id: str = "",
        limited: bool = False,
    ) -> tuple[list[int], dict[int, str]]:
        """Lock up to ``limit`` runnable jobs; their ids, and the lock names by id. ``held``
        gets the names of the locks held, so that a failure can let go of them.

        Each thread of the process tries first a window of its own among the candidates (the
        first thread the head of the line), so that threads listing the same jobs at once
        rarely meet on their locks; only when its window is all taken does it try the rest.
        Locking just ``limit`` jobs spares the statement that would give back the extra ones.
        """
        # A limited queue's claim takes one job, its slot already taken: the head of the line.
        window = 0 if limited else self._window(worker_id)
        locked = self._lock_window(conn, claims, queue, limit, namespace, window, task)
        if locked:
            held.extend(locked.values())
            return list(locked), locked
        wanted = min(limit * OVERFETCH, MAX_CANDIDATES)
        for page in range(PAGES):
            ids = claims.candidate_ids(conn, queue, wanted, page * wanted, task)
            if not ids:
                return [], {}
            names = {job_id: job_lock_name(namespace, job_id) for job_id in ids}
            start = (window * limit) % len(ids)
            ordered = ids[start:] + ids[:start]
            for group in (ordered[:limit], ordered[limit:]):
                locked = self._try_group(conn, group, names, held)
                if locked:
                    keep, extra = locked[:limit], locked[limit:]
                    self.locks.release(conn, [names[i] for i in extra])
                    for job_id in extra:
                        held.remove(names[job_id])
                    return keep, names
            if len(ids) < wanted:
                return [], {}
        return [], {}

    def _lock_and_claim(
        self,
        conn: Connection,
        claims: ClaimStatements,
        queue: str,
        limit: int,
        namespace: str,
        held: list[str],
        worker_id: str,
    ) -> tuple[list[int], dict[int, str], list[Job]] | None:
        """List this thread's window, lock it and mark running what was locked, in one
        statement where the database can (``ClaimStatements.lock_and_claim``): the ids locked, the
        lock names by id, the jobs claimed. None when it cannot, or its window gave nothing
        (the window's page and the rest are then tried as ``_lock_candidates`` does)."""
        prefix = job_lock_prefix(namespace)
        lock = self.locks.try_acquire_named_by(prefix)
        if lock is None:
            return None
        window = self._window(worker_id)
        done = claims.lock_and_claim(conn, queue, limit, window * limit, worker_id, lock)
        if done is None:
            return None
        locked, jobs = done
        names = {job_id: job_lock_name(namespace, job_id) for job_id in locked}
        held.extend(names.values())
        if not jobs and window != 0:
            # Window all taken (or past the end): let go and try from the head of the line.
            self.locks.release(conn, list(names.values()))
            del held[len(held) - len(names) :]
            return None
        return locked, names, jobs

    def _lock_window(
        self,
        conn: Connection,
        claims: ClaimStatements,
        queue: str,
        limit: int,
        namespace: str,
        window: int,
        task: str | None,
    ) -> dict[int, str]:
        """Where the database can name a job's lock in SQL, list this thread's window and lock
        it in one statement: the locks taken, by job id (none: list and lock in two)."""
        prefix = job_lock_prefix(namespace)
        lock = self.locks.try_acquire_named_by(prefix)
        if lock is None:
            return {}
        rows = claims.locked_candidates(conn, queue, limit, window * limit, task, lock)
        return {job_id: job_lock_name(namespace, job_id) for job_id, taken in rows if taken}

    def _try_group(
        self, conn: Connection, group: list[int], names: dict[int, str], held: list[str]
    ) -> list[int]:
        """Try the locks of ``group`` in one round trip; the ids locked (noted in ``held``)."""
        if not group:
            return []
        taken = self.locks.try_acquire(conn, [names[i] for i in group])
        locked = [job_id for job_id, ok in zip(group, taken, strict=True) if ok]
        held.extend(names[i] for i in locked)
        return locked

    def _window(self, worker_id: str) -> int:
        """This thread's window among the candidates: threads are numbered in the order of
        their first claim."""
        with self._mutex:
            return self._windows.setdefault(worker_id, len(self._windows) % OVERFETCH)

    def _take_slot(
        self, conn: Connection, namespace: str, queue: str, slots: int
    ) -> tuple[int, str] | None:
        """Try the slots' locks one at a time, from a random one, until one is free: trying
        them all at once would hold several for a moment, and another worker trying then would
        find them all taken."""
        start = random.randrange(slots)
        for offset in range(slots):
            number = (start + offset) % slots
            name = slot_lock_name(namespace, queue, number)
            if self.locks.try_acquire(conn, [name])[0]:
                return number, name
        return None

    def claim_ids(
        self, conn: Connection, claims: ClaimStatements, ids: list[int], worker_id: str
    ) -> list[Job]:
        namespace = claims.namespace
        names = {job_id: job_lock_name(namespace, job_id) for job_id in ids}
        held: list[str] = []
        try:
            with conn.begin():
                taken = self.locks.try_acquire(conn, list(names.values()))
                locked = [job_id for job_id, ok in zip(ids, taken, strict=True) if ok]
                held = [names[i] for i in locked]
                jobs = claims.claim_ids(conn, locked, worker_id, due_only=False) if locked else []
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

    @property
    def releases_with_outcome(self) -> bool:
        return self.locks.releases_in_transaction

    def release_jobs(self, conn: Connection, claims: ClaimStatements, jobs: list[Job]) -> None:
        """One statement compiled once where the locks have one (a batch's release is on a
        worker's hot path), else the locks by name."""
        prefix = job_lock_prefix(claims.namespace)
        unlock = claims.cached(("unlock", prefix), lambda: self.locks.release_statement(prefix))
        if unlock is None:
            self.locks.release(conn, [f"{prefix}{job.id}" for job in jobs])
        elif jobs:
            claims.compiled(unlock).raw_rows(conn, {"keys": [job.id for job in jobs]})

    def release(
        self,
        conn: Connection,
        claims: ClaimStatements,
        jobs: list[Job],
        jobs_released: bool = False,
    ) -> None:
        """A limited queue's slot waits for the commit: until then the job counts as running."""
        namespace = claims.namespace
        names = [] if jobs_released else [job_lock_name(namespace, job.id) for job in jobs]
        self.locks.release(conn, names + self._slots_of(jobs))

    def release_abandoned(self, claims: ClaimStatements, jobs: list[Job], thread_id: int) -> None:
        namespace = claims.namespace
        names = [job_lock_name(namespace, job.id) for job in jobs]
        self.locks.release_for_thread(thread_id, names + self._slots_of(jobs))

    def _slots_of(self, jobs: list[Job]) -> list[str]:
        """The slot locks held for ``jobs`` (of limited queues), forgotten here."""
        if not self._slot_locks:
            return []
        with self._mutex:
            found = [self._slot_locks.pop(job.id, None) for job in jobs]
        return [name for name in found if name is not None]

    def holds(self, conn: Connection, claims: ClaimStatements, jobs: list[Job]) -> bool:
        namespace = claims.namespace
        return self.locks.holding(conn, [job_lock_name(namespace, job.id) for job in jobs])

    def ask_holds(self, claims: ClaimStatements, jobs: list[Job]) -> Callable[[Connection], bool]:
        namespace = claims.namespace
        return self.locks.ask_holding([job_lock_name(namespace, job.id) for job in jobs])

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

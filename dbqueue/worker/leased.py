"""Jobs run outside their claim's transaction (``@app.task(transaction=False)``).

The claim commits such a job as ``running`` under a lease (``lease_until``) for the worker
thread that claimed it; the handler then runs with no transaction of dbqueue's open (its session
commits its own work), so a long job holds no row lock, no write lock and no open transaction.
The worker's heartbeat moves the leases of the jobs it runs on (``LeaseBook``); a worker that
dies stops moving them, and rescue retries the job once its lease has ended. The outcome
commits in a short transaction of its own, fenced by worker and attempt (``Fence.leased``): a
worker whose lease ended and whose job was rescued (and perhaps claimed again) changes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from sqlalchemy.engine import Connection

from dbqueue.engine import QueueEngine
from dbqueue.job import Job
from dbqueue.strategies import ClaimStrategy
from dbqueue.strategies.base import Fence
from dbqueue.tasks.registry import TaskRegistry
from dbqueue.worker.aio import AsyncSlot
from dbqueue.worker.batch_result import BatchResult, Ran
from dbqueue.worker.batches import units
from dbqueue.worker.handlers import Outcome, Sessions

log = logging.getLogger("dbqueue.worker")

#: Seconds a lease lasts unless the worker's heartbeat moves it on (``lease_seconds``).
DEFAULT_LEASE_SECONDS = 60.0
#: A lease must outlast this many heartbeats, so that one late beat never loses it.
MIN_BEATS_PER_LEASE = 3


class LeaseBook:
    """The leased jobs a worker process runs now (job id → the worker id of the thread that
    runs it): what its heartbeat moves on. Written by the worker's threads, read by the
    heartbeat's."""

    def __init__(self, seconds: float = DEFAULT_LEASE_SECONDS) -> None:
        self.seconds = seconds
        self._held: dict[int, str] = {}
        self._lock = threading.Lock()

    def hold(self, jobs: Sequence[Job], worker_id: str) -> None:
        with self._lock:
            self._held.update((job.id, worker_id) for job in jobs)

    def drop(self, jobs: Sequence[Job]) -> None:
        with self._lock:
            for job in jobs:
                self._held.pop(job.id, None)

    def held(self) -> dict[int, str]:
        with self._lock:
            return dict(self._held)

    def extend(self, conn: Connection, engine: QueueEngine) -> int:
        """Move the leases on (in the caller's transaction); returns how many moved. One that
        did not was rescued meanwhile: its outcome will not be recorded here."""
        held = self.held()
        if not held:
            return 0
        workers = sorted(set(held.values()))
        moved = engine.claims.extend_leases(conn, list(held), workers, self.seconds)
        if moved < len(held):
            log.warning(
                "%d of %d leased job(s) are no longer this worker's (their lease ended and they "
                "were rescued): what their handlers return will not be recorded",
                len(held) - moved,
                len(held),
            )
        return moved


class Executor(Protocol):
    """What ``LeasedRuns`` uses of the ``BatchExecutor`` that owns it."""

    registry: TaskRegistry
    strategy: ClaimStrategy
    worker_id: str
    aio: AsyncSlot | None

    def watch(self, conn: Connection, jobs: list[Job], leased: bool = False) -> None: ...
    def run_unit(self, session: Sessions, unit: list[Job]) -> tuple[list[Outcome], bool]: ...
    def settle(
        self,
        conn: Connection,
        engine: QueueEngine,
        unit: list[Job],
        outcomes: list[Outcome],
        fence: Fence,
    ) -> Ran: ...
    def after_commit(self) -> None: ...


class LeasedRuns:
    """Runs a batch's leased jobs for a ``BatchExecutor``: each handler call outside any
    transaction of dbqueue's, each outcome in a short fenced transaction after it."""

    def __init__(self, executor: Executor, book: LeaseBook | None) -> None:
        self.executor = executor
        self.registry = executor.registry
        self.book = book
        self.seconds = book.seconds if book is not None else DEFAULT_LEASE_SECONDS
        self.fence = Fence.leased(executor.worker_id)

    def take(
        self, conn: Connection, engine: QueueEngine, jobs: list[Job]
    ) -> tuple[list[Job], list[Job]]:
        """Split claimed jobs into those that run in the claim's transaction and those that
        run under a lease, and put the latter under their lease: in the claim's transaction
        (still open: an in-transaction claim) or in one of their own (a committed claim)."""
        registry = self.registry
        if not registry.has_leased:
            return jobs, []
        held = [job for job in jobs if registry.in_transaction(job)]
        if len(held) == len(jobs):
            return jobs, []
        leased = [job for job in jobs if not registry.in_transaction(job)]
        counted = not self.executor.strategy.claims_in_transaction
        worker_id = self.executor.worker_id
        if counted:
            with conn.begin():
                engine.claims.lease(conn, leased, worker_id, self.seconds, counted)
        else:
            engine.claims.lease(conn, leased, worker_id, self.seconds, counted)
        return held, leased

    def run(
        self,
        conn: Connection,
        engine: QueueEngine,
        jobs: list[Job],
        should_stop: Callable[[], bool],
    ) -> BatchResult:
        """Run the leased jobs, one handler call at a time; the lease book holds them meanwhile
        (the heartbeat moves their leases on)."""
        result = BatchResult()
        if self.book is not None:
            self.book.hold(jobs, self.executor.worker_id)
        try:
            todo = units(self.registry, jobs)
            for index, unit in enumerate(todo):
                if should_stop():  # never started: given back as if never claimed
                    rest = [job for later in todo[index:] for job in later]
                    with conn.begin():
                        engine.claims.release_claims(conn, rest, self.fence)
                    result.skipped += len(rest)
                    break
                self._run_unit(conn, engine, unit, result)
        finally:
            if self.book is not None:
                self.book.drop(jobs)
        return result

    def _run_unit(
        self, conn: Connection, engine: QueueEngine, unit: list[Job], result: BatchResult
    ) -> None:
        """One handler call, then its outcome in a transaction of its own."""
        executor = self.executor
        executor.watch(conn, unit, leased=True)
        sessions = Sessions(conn, True, executor.aio, own_transaction=True)
        began = time.monotonic()
        outcomes, _ = executor.run_unit(sessions, unit)
        result.handler_seconds += time.monotonic() - began
        with conn.begin():
            ran = executor.settle(conn, engine, unit, outcomes, self.fence)
        executor.after_commit()
        if ran.lost:
            ids = ", ".join(str(job.id) for job in ran.started[:20])
            log.warning(
                "the outcome of job(s) %s was not recorded: their lease ended before they "
                "finished, and they were rescued (they run again)",
                ids,
            )
        executor.strategy.release(conn, engine.claims, unit)
        if ran.lost:  # counted by the claim that owns them now
            result.skipped += len(unit)
            return
        result.succeeded += ran.result.succeeded
        result.failed += ran.result.failed
        result.cancelled += ran.result.cancelled
        result.skipped += ran.result.skipped

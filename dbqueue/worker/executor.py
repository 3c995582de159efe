"""Runs the handlers of claimed jobs and writes their outcomes, in the right transactions.

Two kinds of claims reach it (the strategy's ``claims_in_transaction`` says which). An
in-transaction claim (skip_locked, sqlite, lock_server on SQLite) lives in the batch
transaction the runner opened: ``execute()`` runs the handlers in it, each in a savepoint, and
the runner commits. A committed claim (advisory_lock, lock_server elsewhere) already marked the jobs
``running``; ``execute_committed()`` opens the transactions itself, and fences each commit:
the outcome UPDATE only matches rows still ``running`` under this worker's id, and the strategy
confirms it still holds the jobs' locks. If either check fails, another worker may own the job
now (a lock server restarted and rescue handed the job on), so the transaction rolls back with
the handlers' writes, and the job is given back — it runs once, never twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy.engine import Connection

from dbqueue.base.wakeup import Notifier
from dbqueue.engine import QueueEngine
from dbqueue.errors import DbqueueError
from dbqueue.job import Job
from dbqueue.runtime.context import RuntimeContext
from dbqueue.strategies import ClaimStrategy
from dbqueue.strategies.base import Fence
from dbqueue.tasks.failures import AttemptError
from dbqueue.tasks.retry import BACKOFF, Requested
from dbqueue.worker.aio import AsyncSlot
from dbqueue.worker.batch_result import BatchResult, Ran
from dbqueue.worker.batches import units
from dbqueue.worker.finished import FinishedJobs
from dbqueue.worker.handlers import HandlerCalls, Outcome, Sessions
from dbqueue.worker.joblog import JobLog
from dbqueue.worker.leased import LeaseBook, LeasedRuns
from dbqueue.worker.watchdog import Slot, Watchdog

log = logging.getLogger("dbqueue.worker")


class ClaimLostError(DbqueueError):
    """A committed claim is no longer this worker's: its transaction must not commit."""


class _HandlerFailed(Exception):
    """Without savepoints a failed handler's writes go only with the whole transaction."""

    def __init__(self, outcomes: list[Outcome]) -> None:
        super().__init__(outcomes[0].message)
        self.outcomes = outcomes


class BatchExecutor:
    def __init__(
        self,
        context: RuntimeContext,
        strategy: ClaimStrategy,
        worker_id: str,
        *,
        watchdog: Watchdog | None = None,
        slot: Slot | None = None,
        default_timeout: float | None = None,
        job_log: JobLog | None = None,
        notifier: Notifier | None = None,
        aio: AsyncSlot | None = None,
        leases: LeaseBook | None = None,
    ) -> None:
        self.registry = context.registry
        self.policy = context.retry_policy
        self.local_workers = context.local_workers
        self.strategy = strategy
        self.worker_id = worker_id
        #: What this thread's outcomes must find in their jobs' rows (its claims' fence).
        self.fence = strategy.fence(worker_id)
        #: Told of each dead-letter job a failure inserts (eager mode runs them next).
        self.on_dead_letter: Callable[[int], object] | None = None
        #: Where this queue's cancel requests are (the one a cancelled job's is deleted from).
        self.cancel_requests = context.cancel_requests()
        self.savepoints = strategy.dialect.supports_savepoints
        #: Where a stuck handler's thread's connection and batch are noted for the watchdog.
        self.slot = slot
        self.handlers = HandlerCalls(
            context, watchdog=watchdog, slot=slot, default_timeout=default_timeout, aio=aio
        )
        #: With ``log_jobs``: notes each run, logs it once committed. Without, no cost per job.
        self.job_log = job_log
        run_one = context.instruments.wrap_run(self.handlers.run_one)  # tracing: a span per job
        run_group = self.handlers.run_group
        self.run_job = run_one if job_log is None else job_log.timed(run_one)
        self.run_jobs = run_group if job_log is None else job_log.timed_group(run_group)
        #: Awaited jobs (app.call) whose end is pushed after the commit (the lock server).
        self.finished = FinishedJobs(notifier, context.names.qualified_jobs)
        #: Set in an async slot (its sessions are async ones for async handlers).
        self.aio = aio
        self._last_sessions: Sessions | None = None
        #: Jobs of tasks that run outside their claim's transaction, under a lease.
        self.leased = LeasedRuns(self, leases)

    def _sessions(self, conn: Connection, savepoint: bool = True) -> Sessions:
        """The sessions of a batch: the last batch's again when it ran on the same connection
        and left them unused (an ORM Session costs more to make than a no-op job's handler)."""
        last = self._last_sessions
        if last is not None and last.conn is conn and last.savepoint == savepoint and last.reset():
            return last
        self._last_sessions = Sessions(conn, savepoint, self.aio)
        return self._last_sessions

    # ---- in-transaction claims ----------------------------------------------------------------
    def execute(
        self,
        conn: Connection,
        engine: QueueEngine,
        jobs: list[Job],
        should_stop: Callable[[], bool],
    ) -> BatchResult:
        """Run each job in turn (each failure rolls back only its own savepoint), then mark the
        successes in one UPDATE. The caller commits the transaction."""
        ran = self._run_batch(conn, engine, jobs, should_stop)
        changed = engine.outcomes.complete(conn, ran.done, self.fence)
        if changed != len(ran.done):
            log.warning(
                "marked %d of %d finished jobs succeeded: the others changed state while running",
                changed,
                len(ran.done),
            )
        return ran.result

    # ---- committed claims ---------------------------------------------------------------------
    def execute_committed(
        self,
        conn: Connection,
        engine: QueueEngine,
        jobs: list[Job],
        should_stop: Callable[[], bool],
    ) -> BatchResult:
        """Run jobs whose claim is committed, in transactions of its own, fencing each commit."""
        if not self.savepoints:
            return self._one_by_one(conn, engine, jobs, should_stop)
        try:
            with conn.begin():
                ran = self._run_batch(conn, engine, jobs, should_stop)
                claims = engine.claims
                holds = self.strategy.ask_holds(claims, ran.started) if ran.started else None
                # No handler wrote: the fenced UPDATE may commit alone, then the release.
                with engine.dialect.statements_alone(conn):
                    changed = engine.outcomes.complete(conn, ran.done, self.fence)
                    self._check_still_ours(conn, engine, ran.started, changed + ran.changed, holds)
                    if self.strategy.releases_with_outcome:
                        self.strategy.release_jobs(conn, claims, jobs)
                        ran.result.released = True
        except ClaimLostError as lost:
            self._lost(conn, engine, jobs, lost)
            return BatchResult(skipped=len(jobs))
        self.after_commit()
        return ran.result

    def _one_by_one(
        self,
        conn: Connection,
        engine: QueueEngine,
        jobs: list[Job],
        should_stop: Callable[[], bool],
    ) -> BatchResult:
        """No savepoints (SingleStore): a transaction per handler call, and a failed handler's
        writes are undone by rolling back that whole transaction; its failure is recorded in
        another."""
        result = BatchResult()
        todo = units(self.registry, jobs)
        for index, unit in enumerate(todo):
            if should_stop():
                rest = [job for later in todo[index:] for job in later]
                with conn.begin():
                    engine.claims.release_claims(conn, rest, self.fence)
                result.skipped += len(rest)
                break
            try:
                try:
                    with conn.begin():
                        self.watch(conn, unit)
                        began = time.monotonic()
                        outcomes, undone = self.run_unit(
                            self._sessions(conn, savepoint=False), unit
                        )
                        result.handler_seconds += time.monotonic() - began
                        if undone:
                            raise _HandlerFailed(outcomes)
                        ran = self._settle_alone(conn, engine, unit, outcomes)
                except _HandlerFailed as failed:
                    with conn.begin():
                        ran = self._settle_alone(conn, engine, unit, failed.outcomes)
                self.after_commit()
                _add(result, ran.result)
            except ClaimLostError as lost:
                self._lost(conn, engine, unit, lost)
                result.skipped += len(unit)
        return result

    def _settle_alone(
        self, conn: Connection, engine: QueueEngine, unit: list[Job], outcomes: list[Outcome]
    ) -> Ran:
        """Write one handler call's outcomes in its own transaction, fenced."""
        ran = self.settle(conn, engine, unit, outcomes, self.fence)
        self._check_still_ours(conn, engine, ran.started, ran.recorded)
        return ran

    def settle(
        self,
        conn: Connection,
        engine: QueueEngine,
        unit: list[Job],
        outcomes: list[Outcome],
        fence: Fence,
    ) -> Ran:
        """Write one handler call's outcomes, fenced by ``fence``, after its claim's transaction
        ended; ``lost``: some changed no row (the job is another claim's now)."""
        ran = Ran()
        self._take(conn, engine, unit, outcomes, ran, fence)
        changed = engine.outcomes.complete(conn, ran.done, fence)
        engine.claims.release_claims(conn, ran.unstarted, fence)
        self.finished.note(ran.started)
        ran.recorded = changed + ran.changed
        ran.result.skipped = len(ran.unstarted)
        return ran

    def give_back(
        self, conn: Connection, engine: QueueEngine, jobs: list[Job], fence: Fence | None = None
    ) -> None:
        """After a failed transaction: put the jobs this worker still has 'running' back to
        'available', as if never started (``fence``: whose claim, by default this thread's).
        Best effort (the database may be what failed); what is left behind, rescue retries once
        the locks are free (or the leases end)."""
        if self.slot is not None and self.slot.abandoned:
            return  # its connection was ended under it (the error says so): it writes no more
        try:
            if conn.in_transaction():
                conn.rollback()
            with conn.begin():
                engine.claims.release_claims(conn, jobs, fence or self.fence)
        except Exception as exc:  # the connection is broken: rescue takes over
            log.debug("could not give back %d claimed job(s): %s", len(jobs), exc)

    def _check_still_ours(
        self,
        conn: Connection,
        engine: QueueEngine,
        started: list[Job],
        changed: int,
        holds: Callable[[Connection], bool] | None = None,
    ) -> None:
        """Raise ClaimLostError unless every outcome UPDATE matched and every lock is held
        (``holds``: the strategy's answer, asked before the UPDATE)."""
        if not started:
            return
        if holds is None:
            holds = self.strategy.ask_holds(engine.claims, started)
        if changed != len(started):
            raise ClaimLostError(
                f"{len(started) - changed} of {len(started)} job(s) were no longer running "
                "under this worker"
            )
        if not holds(conn):
            raise ClaimLostError("the lock server no longer knows this worker as their holder")

    def _lost(self, conn: Connection, engine: QueueEngine, jobs: list[Job], exc: Exception) -> None:
        ids = ", ".join(str(job.id) for job in jobs[:20])
        log.warning(
            "rolled back job(s) %s: %s (another worker may have taken them over while the lock "
            "server was unreachable); any not already marked done will run again, once",
            ids,
            exc,
        )
        if self.job_log is not None:
            self.job_log.drop()
        self.give_back(conn, engine, jobs)

    # ---- running handlers ---------------------------------------------------------------------
    def _run_batch(
        self,
        conn: Connection,
        engine: QueueEngine,
        jobs: list[Job],
        should_stop: Callable[[], bool],
    ) -> Ran:
        ran = Ran()
        session = self._sessions(conn)
        if self.job_log is not None:
            self.job_log.drop()  # runs noted in a batch that failed never committed
        self.finished.drop()
        self.watch(conn, jobs)
        todo = units(self.registry, jobs)
        single = not self.registry.has_batches  # every unit is one job of a plain task
        clock = time.monotonic
        for index, unit in enumerate(todo):
            # A job that used a tenant database ends its batch: its tenant commit is then
            # immediately followed by the batch's (the job's completion) commit.
            if should_stop() or session.tenant_used:  # never started: given back untouched
                ran.unstarted += [job for later in todo[index:] for job in later]
                break
            began = clock()
            if single:
                outcome = self.run_job(session, unit[0])
                ran.result.handler_seconds += clock() - began
                if outcome.ok:  # the common case, noted as _take would, without its loop
                    ran.started.append(unit[0])
                    ran.done.append((unit[0], outcome.value))
                    ran.result.succeeded += 1
                    continue
                outcomes = [outcome]
            else:
                outcomes, _ = self.run_unit(session, unit)
                ran.result.handler_seconds += clock() - began
            self._take(conn, engine, unit, outcomes, ran)
        ran.result.skipped = len(ran.unstarted)
        self.finished.note(ran.started)
        if ran.unstarted and not self.strategy.claims_in_transaction:
            engine.claims.release_claims(conn, ran.unstarted, self.fence)  # committed: undo
        return ran

    def run_unit(self, session: Sessions, unit: list[Job]) -> tuple[list[Outcome], bool]:
        """One handler call: its jobs' outcomes, and whether its writes were undone."""
        registry = self.registry
        if len(unit) > 1 or (registry.has_batches and registry.batch_of(unit[0]) is not None):
            return self.run_jobs(session, unit)
        outcome = self.run_job(session, unit[0])
        return [outcome], not outcome.ok

    def _take(
        self,
        conn: Connection,
        engine: QueueEngine,
        unit: list[Job],
        outcomes: list[Outcome],
        ran: Ran,
        fence: Fence | None = None,
    ) -> None:
        """Note a handler call's successes, record its failures (fenced by ``fence``, else
        this thread's claims' fence), set aside the jobs it gave back."""
        fence = fence or self.fence
        for job, outcome in zip(unit, outcomes, strict=True):
            if outcome.given_back:
                ran.unstarted.append(job)
                continue
            ran.started.append(job)
            if outcome.ok:
                ran.done.append((job, outcome.value))
                ran.result.succeeded += 1
                continue
            ran.changed += self._record(conn, engine, job, outcome, fence)
            if outcome.cancelled:
                ran.result.cancelled += 1
            else:
                ran.result.failed += 1

    def _record(
        self, conn: Connection, engine: QueueEngine, job: Job, outcome: Outcome, fence: Fence
    ) -> int:
        """Record a handler's failed outcome: cancelled on request, or a failed attempt (with
        the retry its handler asked for, if any); returns the rows changed."""
        if outcome.cancelled:
            return self.record_cancelled(conn, engine, job, outcome.message or "cancelled", fence)
        message, requested = outcome.message or "failed", outcome.requested
        return self.record_failure(conn, engine, job, message, fence, requested, outcome.error)

    def after_commit(self) -> None:
        """The jobs run so far have committed their outcomes: log them (with ``log_jobs``), and
        tell the callers waiting for some of them (``app.call``) through the lock server."""
        if self.job_log is not None:
            self.job_log.committed()
        self.finished.committed()

    def watch(self, conn: Connection, jobs: list[Job], leased: bool = False) -> None:
        """Tell the watchdog's slot what a stuck handler's thread holds."""
        if self.slot is not None:
            self.slot.connection, self.slot.batch, self.slot.leased = conn, jobs, leased

    def record_cancelled(
        self, conn: Connection, engine: QueueEngine, job: Job, message: str, fence: Fence
    ) -> int:
        """Record a job stopped on request as cancelled (no retry, no dead handler) and delete
        its requests; returns the rows changed (0: not this claim's)."""
        requested_at = job.cancel_requested_at
        changed = engine.cancels.cancel_running(conn, job, fence, message, requested_at)
        if changed:
            self.cancel_requests.drop(conn, [job.id])
            log.warning(
                "job %s (%s) cancelled at attempt %s: %s",
                job.id,
                job.task,
                job.attempt,
                message.splitlines()[0],
            )
        return changed

    def record_failure(
        self,
        conn: Connection,
        engine: QueueEngine,
        job: Job,
        message: str,
        fence: Fence,
        requested: Requested = BACKOFF,
        error: AttemptError | None = None,
    ) -> int:
        """Record a failed attempt (retry or dead) as the retry policy decides; returns the
        rows changed (0: not this claim's). ``requested``: what Discard or Retry asked for;
        ``error``: the attempt's entry in the job's errors (None: ``message``, no traceback)."""
        failure = self.policy.failure(job, message, requested, error)
        failed = engine.outcomes.fail(conn, job, fence, failure)
        self.local_workers.due_in(failure.retry_in)  # an idle poller sleeps no longer than that
        if failed.dead_letter_id is not None and self.on_dead_letter is not None:
            self.on_dead_letter(failed.dead_letter_id)
        first_line = message.splitlines()[0] if message else ""
        if failure.retry_in is None:
            log.warning(
                "job %s (%s) is dead after attempt %s/%s: %s%s",
                job.id,
                job.task,
                job.attempt,
                job.max_attempts,
                first_line,
                f"; dead-letter job {failed.dead_letter_id} will run its dead handler"
                if failed.dead_letter_id
                else "",
            )
        else:
            log.warning(
                "job %s (%s) failed attempt %s/%s, retry in %.1fs: %s",
                job.id,
                job.task,
                job.attempt,
                job.max_attempts,
                failure.retry_in,
                first_line,
            )
        return failed.changed


def _add(total: BatchResult, part: BatchResult) -> None:
    total.succeeded += part.succeeded
    total.failed += part.failed
    total.skipped += part.skipped
    total.cancelled += part.cancelled
    total.handler_seconds += part.handler_seconds

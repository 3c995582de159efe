"""Runs the handlers of claimed jobs and writes their outcomes, in the right transactions.

Two kinds of claims reach it. An in-transaction claim (skip_locked, sqlite) lives in the batch
transaction the runner opened: ``execute()`` runs the handlers in it, each in a savepoint, and
the runner commits. A committed claim (advisory_lock, lock_server) already marked the jobs
``running``; ``execute_committed()`` opens the transactions itself, and fences each commit:
the outcome UPDATE only matches rows still ``running`` under this worker's id, and the strategy
confirms it still holds the jobs' locks. If either check fails, another worker may own the job
now (a lock server restarted and rescue handed the job on), so the transaction rolls back with
the handlers' writes, and the job is given back — it runs once, never twice.
"""

from __future__ import annotations

import inspect
import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection

from ..engine import QueueEngine
from ..errors import (
    AttemptFailed,
    DbqueueError,
    Discard,
    JobCancelledError,
    JobTimeoutError,
    Retry,
)
from ..job import Job, MalformedPayload
from ..results import encode_result
from ..retry import BACKOFF, Requested
from ..runtime import RuntimeContext
from ..strategies import ClaimStrategy
from ..tasks import Handler
from ..wakeup import Notifier
from .finished import FinishedJobs
from .joblog import JobLog
from .session import JobSession
from .watchdog import Abandoned, HandlerCancelled, HandlerTimeout, Slot, Watchdog

log = logging.getLogger("dbqueue.worker")


@dataclass
class BatchResult:
    succeeded: int = 0
    failed: int = 0
    skipped: int = 0
    cancelled: int = 0


@dataclass(frozen=True)
class Outcome:
    """What running one job's handler produced. ``value``: what a success stores (None, the
    result's JSON, or a Message); ``message``: a failure's; ``requested``: the retry a failure
    asks for (the backoff rule; None: dead now, the handler raised Discard; seconds: Retry)."""

    ok: bool
    message: str | None = None
    value: str | None = None
    requested: Requested = BACKOFF
    #: The job was cancelled on request: recorded ``cancelled``, not as a failed attempt.
    cancelled: bool = False


#: A handler that returned None: the common case, one shared object.
SUCCEEDED = Outcome(True)


@dataclass
class _Ran:
    """What running a batch's handlers produced, before the successes are written."""

    result: BatchResult = field(default_factory=BatchResult)
    done: list[tuple[Job, str | None]] = field(default_factory=list)  # (job, stored value)
    started: list[Job] = field(default_factory=list)
    changed: int = 0  # rows the failures' UPDATEs changed


class ClaimLostError(DbqueueError):
    """A committed claim is no longer this worker's: its transaction must not commit."""


class _HandlerFailed(Exception):
    """Without savepoints a failed handler's writes go only with the whole transaction."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.message)
        self.outcome = outcome


class _Cancelled(JobCancelledError):
    """The job's cancel request was delivered: whatever its handler did, it ends cancelled."""


def describe_failure(exc: BaseException) -> str:
    """What the job's message column records: the exception, then where it came from."""
    head = f"{type(exc).__name__}: {exc}".rstrip(": ")
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=20))
    return f"{head}\n{trace}"


def asked_for(exc: Discard | Retry) -> Outcome:
    """The failed attempt a handler's Discard (dead now) or Retry (again in exactly that many
    seconds) stands for; its message starts the way the handler raised it."""
    if isinstance(exc, Discard):
        return Outcome(
            False, f"Discard: {exc.reason or 'the handler discarded the job'}", None, None
        )
    reason = f": {exc.reason}" if exc.reason else ""
    return Outcome(False, f"Retry(in_seconds={exc.in_seconds:g}){reason}", None, exc.in_seconds)


def cancel_message(job: Job, ran: bool = True) -> str:
    asked = job._cancel_requested_at
    when = f" (asked at {asked:%Y-%m-%d %H:%M:%S} UTC)" if asked is not None else ""
    return f"cancelled on request{when} {'while running' if ran else 'before its handler started'}"


def timeout_message(job: Job, timeout: float) -> str:
    return (
        f"job {job.id} (task {job.task!r}) ran past its {float(timeout)!r} s timeout and was "
        "interrupted: make the handler faster, or give it more time with "
        "@app.task(..., timeout=SECONDS) (or --job-timeout / DBQUEUE_JOB_TIMEOUT for the worker)"
    )


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
    ) -> None:
        self.registry = context.registry
        self.max_result_bytes = context.max_payload_bytes
        self.policy = context.retry_policy
        #: Runs deliveries no code is registered for: webhook calls.
        self.webhooks = context.webhooks
        self.strategy = strategy
        self.worker_id = worker_id
        #: Where this queue's cancel requests are (the one a cancelled job's is deleted from).
        self.cancel_requests = context.cancel_requests()
        self.savepoints = strategy.dialect.supports_savepoints
        #: Set in a Worker: the handler runs watched, for timeouts and cancel requests (in
        #: memory only).
        self.watchdog = watchdog
        self.slot = slot
        self.default_timeout = default_timeout
        #: With ``log_jobs``: notes each run, logs it once committed. Without, no cost per job.
        self.job_log = job_log
        run_one = context.instruments.wrap_run(self.run_one)  # tracing: a span per job
        self.run_job = run_one if job_log is None else job_log.timed(run_one)
        #: Awaited jobs (app.call) whose end is pushed after the commit (the lock server).
        self.finished = FinishedJobs(notifier, context.names.qualified_jobs)

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
        ran = self._run_batch(conn, engine, jobs, should_stop, claimed_by=None)
        changed = self._complete(conn, engine, ran.done, claimed_by=None)
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
                ran = self._run_batch(conn, engine, jobs, should_stop, claimed_by=self.worker_id)
                changed = self._complete(conn, engine, ran.done, claimed_by=self.worker_id)
                self._check_still_ours(conn, engine, ran.started, changed + ran.changed)
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
        """No savepoints (SingleStore): a transaction per job, and a failed handler's writes are
        undone by rolling back that whole transaction; its failure is recorded in another."""
        result = BatchResult()
        for index, job in enumerate(jobs):
            if should_stop():
                with conn.begin():
                    engine.release_claims(conn, jobs[index:], claimed_by=self.worker_id)
                result.skipped = len(jobs) - index
                break
            try:
                try:
                    with conn.begin():
                        self._watch(conn, [job])
                        outcome = self.run_job(JobSession(conn, savepoint=False), job)
                        if not outcome.ok:
                            raise _HandlerFailed(outcome)
                        self.finished.note([job])
                        done = [(job, outcome.value)]
                        changed = self._complete(conn, engine, done, claimed_by=self.worker_id)
                        self._check_still_ours(conn, engine, [job], changed)
                    result.succeeded += 1
                    self.after_commit()
                except _HandlerFailed as failed:
                    self.finished.note([job])
                    with conn.begin():
                        recorded = self._record(conn, engine, job, failed.outcome, self.worker_id)
                        self._check_still_ours(conn, engine, [job], recorded)
                    if failed.outcome.cancelled:
                        result.cancelled += 1
                    else:
                        result.failed += 1
                    self.after_commit()
            except ClaimLostError as lost:
                self._lost(conn, engine, [job], lost)
                result.skipped += 1
        return result

    def give_back(self, conn: Connection, engine: QueueEngine, jobs: list[Job]) -> None:
        """After a failed transaction: put the jobs this worker still has 'running' back to
        'available', as if never started. Best effort (the database may be what failed); what
        is left behind, rescue retries once the locks are free."""
        try:
            if conn.in_transaction():
                conn.rollback()
            with conn.begin():
                engine.release_claims(conn, jobs, claimed_by=self.worker_id)
        except Exception as exc:  # the connection is broken: rescue takes over
            log.debug("could not give back %d claimed job(s): %s", len(jobs), exc)

    def _check_still_ours(
        self, conn: Connection, engine: QueueEngine, started: list[Job], changed: int
    ) -> None:
        """Raise ClaimLostError unless every outcome UPDATE matched and every lock is held."""
        if not started:
            return
        if changed != len(started):
            raise ClaimLostError(
                f"{len(started) - changed} of {len(started)} job(s) were no longer running "
                "under this worker"
            )
        if not self.strategy.holds(conn, engine, started):
            raise ClaimLostError("the lock server no longer knows this worker as their holder")

    def _lost(self, conn: Connection, engine: QueueEngine, jobs: list[Job], exc: Exception) -> None:
        ids = ", ".join(str(job.id) for job in jobs[:20])
        log.warning(
            "rolled back job(s) %s: %s (another worker may have taken them over while the lock "
            "server was unreachable); they will run again, once",
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
        claimed_by: str | None,
    ) -> _Ran:
        ran = _Ran()
        unstarted: list[Job] = []
        session = JobSession(conn)
        if self.job_log is not None:
            self.job_log.drop()  # runs noted in a batch that failed never committed
        self.finished.drop()
        self._watch(conn, jobs)
        for job in jobs:
            if should_stop():
                unstarted.append(job)  # never started: given back untouched
                continue
            ran.started.append(job)
            outcome = self.run_job(session, job)
            if outcome.ok:
                ran.done.append((job, outcome.value))
                ran.result.succeeded += 1
                continue
            ran.changed += self._record(conn, engine, job, outcome, claimed_by)
            if outcome.cancelled:
                ran.result.cancelled += 1
            else:
                ran.result.failed += 1
        ran.result.skipped = len(unstarted)
        self.finished.note(ran.started)
        if unstarted and not self.strategy.claims_in_transaction:
            engine.release_claims(conn, unstarted, claimed_by=claimed_by)  # committed: undo it
        return ran

    def _complete(
        self,
        conn: Connection,
        engine: QueueEngine,
        done: list[tuple[Job, str | None]],
        claimed_by: str | None,
    ) -> int:
        return engine.complete(
            conn,
            done,
            attempt_increment=self.strategy.attempt_increment,
            expected_status=self.strategy.claimed_status,
            worker_id=self.worker_id,
            claimed_by=claimed_by,
        )

    def _record(self, conn: Connection, engine: Any, job: Job, outcome: Outcome, by: Any) -> int:
        """Record a handler's failed outcome: cancelled on request, or a failed attempt (with
        the retry its handler asked for, if any); returns the rows changed."""
        if outcome.cancelled:
            return self.record_cancelled(conn, engine, job, outcome.message or "cancelled", by)
        message, requested = outcome.message or "failed", outcome.requested
        return self.record_failure(conn, engine, job, message, by, requested=requested)

    def after_commit(self) -> None:
        """The jobs run so far have committed their outcomes: log them (with ``log_jobs``), and
        tell the callers waiting for some of them (``app.call``) through the lock server."""
        if self.job_log is not None:
            self.job_log.committed()
        self.finished.committed()

    def _watch(self, conn: Connection, jobs: list[Job]) -> None:
        """Tell the watchdog's slot what a stuck handler's thread holds."""
        if self.slot is not None:
            self.slot.connection, self.slot.batch = conn, jobs

    def run_one(self, session: JobSession, job: Job) -> Outcome:
        try:
            definition, handler = self.registry.resolve(job, self.webhooks)
        except DbqueueError as exc:
            return Outcome(False, str(exc))
        if isinstance(job.payload, MalformedPayload):
            return Outcome(
                False,
                f"{job.payload.error}; the row was probably written by hand: fix its payload "
                "column and requeue it",
            )
        try:
            if self.watchdog is None:
                value = handler(job, session)
            else:
                timeout = (definition.timeout if definition else None) or self.default_timeout
                value = self._run_watched(handler, job, session, timeout)
            if inspect.isawaitable(value):
                _close(value)
                raise TypeError(
                    f"the handler returned {type(value).__name__} {value!r} instead of running: "
                    "it is async (or returns an awaitable), which a worker thread cannot await; "
                    "make it a plain def"
                )
            stored = None if value is None else encode_result(value, self.max_result_bytes)
            session.keep()
        except Abandoned:
            raise
        except _Cancelled as exc:  # whatever the handler did, its writes go
            session.discard()
            return Outcome(False, str(exc), cancelled=True)
        except AttemptFailed as exc:  # an expected failure whose message says it all
            session.discard()
            return Outcome(False, str(exc))
        except (Discard, Retry) as exc:  # the handler says when the job runs again, if ever
            session.discard()
            return asked_for(exc)
        # BaseException: SystemExit, KeyboardInterrupt or GeneratorExit raised by a handler in
        # this thread would otherwise end the thread silently, leaving the worker short of one.
        except BaseException as exc:
            if session.bind.invalidated:  # type: ignore[union-attr]
                # The database connection broke under the handler (server restart, network):
                # the batch transaction is gone with it, so nothing can be recorded, and the
                # job is not at fault. The worker loop reconnects; the jobs are claimed again.
                raise
            session.discard()
            log.debug("job %s (%s) raised", job.id, job.task, exc_info=True)
            return Outcome(False, describe_failure(exc))
        return SUCCEEDED if stored is None else Outcome(True, value=stored)

    def _run_watched(
        self, handler: Handler, job: Job, session: JobSession, timeout: float | None
    ) -> Any:
        """Run the handler with the watchdog armed; a timeout becomes JobTimeoutError, and a
        cancel request that reached the job (``job.cancel_requested()``) _Cancelled."""
        watchdog, slot = self.watchdog, self.slot
        assert watchdog is not None and slot is not None
        error: BaseException | None = None
        value = None
        if not watchdog.arm(slot, job, timeout):
            raise _Cancelled(cancel_message(job, ran=False))
        try:
            try:
                value = handler(job, session)
            except BaseException as exc:
                error = exc
            finally:
                fired = watchdog.disarm(slot)
        except (HandlerTimeout, HandlerCancelled):  # arrived after the handler returned, before
            fired = watchdog.disarm(slot)  # disarm cancelled it
        if slot.abandoned:
            raise Abandoned
        if job._cancel_requested_at is not None:
            cause = None if isinstance(error, HandlerCancelled) else error
            raise _Cancelled(
                f"{cancel_message(job)}: its database writes were rolled back"
            ) from cause
        if fired:
            assert timeout is not None
            cause = error if error is not None and not isinstance(error, HandlerTimeout) else None
            raise JobTimeoutError(timeout_message(job, timeout)) from (cause or error)
        if error is not None:
            raise error
        return value

    def record_cancelled(
        self,
        conn: Connection,
        engine: QueueEngine,
        job: Job,
        message: str,
        claimed_by: str | None = None,
        guarded: bool = False,
    ) -> int:
        """Record a job stopped on request as cancelled (no retry, no dead handler) and delete
        its requests; returns the rows changed (0: not ours). ``guarded`` as for failures."""
        changed = engine.cancel_running(
            conn,
            job,
            message,
            requested_at=job._cancel_requested_at,
            attempt_increment=self.strategy.attempt_increment,
            expected_status=self.strategy.claimed_status,
            worker_id=self.worker_id,
            claimed_by=claimed_by,
            same_attempt=guarded,
        )
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
        claimed_by: str | None = None,
        guarded: bool = False,
        requested: Requested = BACKOFF,
    ) -> int:
        """Record a failed attempt (retry or dead); returns the rows changed (0: not ours).
        ``guarded``: only if the row is still at the attempt that ran (recording from outside
        the batch transaction, after its end). ``requested``: what Discard or Retry asked for."""
        failed, delay = self.policy.fail(
            conn,
            engine,
            job,
            message,
            requested=requested,
            attempt_increment=self.strategy.attempt_increment,
            expected_status=self.strategy.claimed_status,
            worker_id=self.worker_id,
            claimed_by=claimed_by,
            same_attempt=guarded,
        )
        first_line = message.splitlines()[0] if message else ""
        if delay is None:
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
                delay,
                first_line,
            )
        return failed.changed


def _close(awaitable: Any) -> None:
    """Close a coroutine that will never run, so Python does not warn it was never awaited."""
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()

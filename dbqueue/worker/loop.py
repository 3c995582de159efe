"""A worker thread's loop: claim a batch from each queue in turn, run it, and when nothing is
runnable wait — one idle thread polls for all, the others wait for it or for a push. One claim
and the run of what it got, in the transactions the strategy's kind of claim needs, is
``claim_and_run`` (eager mode uses it too, claiming given jobs by id)."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dbqueue.base.results import running_handlers
from dbqueue.base.wakeup import Notifier
from dbqueue.engine import QueueEngine
from dbqueue.errors import SchemaMissingError
from dbqueue.job import Job
from dbqueue.lockserver.client import LockServerUnavailableError
from dbqueue.worker.aio import AsyncSlot, LoopWaits, Waits
from dbqueue.worker.batch_result import BatchResult
from dbqueue.worker.batches import gather
from dbqueue.worker.executor import BatchExecutor
from dbqueue.worker.joblog import JobLog, JobLogWriter
from dbqueue.worker.leased import LeaseBook
from dbqueue.worker.process import discard as _discard
from dbqueue.worker.process import first_line as _first_line
from dbqueue.worker.state import RunState
from dbqueue.worker.watchdog import Abandoned, Slot, Watchdog

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext
    from dbqueue.strategies import ClaimStrategy

log = logging.getLogger("dbqueue.worker")

# A batch grows while its jobs are this fast on average; slower jobs are claimed one at a time so
# that idle threads can take the rest instead of waiting behind a long handler.
FAST_JOB_SECONDS = 0.05
MAX_RECONNECT_DELAY = 30.0
#: Idle sleeps shorter than this are not worth a query for the next scheduled job.
SHORT_SLEEP = 0.5
#: After an early wake-up (sent just before the enqueue's commit), idle threads look again after
#: this long, doubling up to EARLY_WAKE_LAST: the job may not have been visible yet.
EARLY_WAKE_FIRST = 0.005
EARLY_WAKE_LAST = 1.0
#: Longest idle sleep after a round that found a limited queue's slots all taken: a slot frees
#: when a job ends or its worker dies, which nothing pushes.
SLOTS_FULL_POLL = 1.0
#: While a queue is empty one idle thread polls for all; the others wait for it to find work
#: (or for a push), with this long a safety net.
FOLLOWER_WAIT = 30.0


@dataclass
class _ThreadState:
    """What one worker thread (or async slot) carries from round to round."""

    turn: int
    idle: float
    early_seen: int
    engine: Engine
    waits: Waits
    conn: Connection | None = None
    failures: int = 0
    batch: int = 1
    recheck: float = EARLY_WAKE_LAST * 2  # no early wake pending
    polling: bool = False  # this thread is the idle poller
    woken: bool = False  # its last idle wait ended with a wake-up
    slots_full: bool = False  # the last round found a limited queue's slots all taken


@dataclass(frozen=True)
class ClaimPlan:
    """What a worker's threads claim and how they pace themselves, as settled at start-up."""

    worker_name: str
    queues: tuple[str, ...]
    queue_limits: dict[str, int]
    burst: bool
    batch_size: int
    min_poll_interval: float
    poll_interval: float
    job_timeout: float | None


class ClaimLoop:
    """The loop every worker thread (or async slot) runs: claim, run, count, wait when idle.

    ``report(exc)`` tells the App's error hooks, naming the worker."""

    def __init__(
        self,
        context: RuntimeContext,
        plan: ClaimPlan,
        run_state: RunState,
        engine: Engine,
        strategy: ClaimStrategy,
        notifier: Notifier,
        watchdog: Watchdog,
        job_log_writer: JobLogWriter | None,
        report: Callable[[BaseException], None],
        leases: LeaseBook | None = None,
    ) -> None:
        self.context = context
        self.plan = plan
        self.run_state = run_state
        self.engine = engine
        self.strategy = strategy
        self.notifier = notifier
        self.watchdog = watchdog
        self.job_log_writer = job_log_writer
        self.report = report
        #: The leased jobs the worker runs, whose leases its heartbeat moves on.
        self.leases = leases

    def thread_main(self, index: int, aio: AsyncSlot | None = None) -> None:
        """One slot's loop: a worker thread's (``aio`` None), or an async slot's, run in a
        greenlet on the worker's event loop (see ``aio.py``): the same code either way."""
        try:
            with running_handlers():  # app.call from a handler is refused: it would wait on itself
                self._thread_loop(index, aio)
        except Abandoned:
            if not self.run_state.stop_now.is_set():  # else the worker has said it stopped
                log.info("abandoned worker thread %d unblocked and ended without writing", index)
        except BaseException as exc:  # a bug: say so, and let the supervisor see the thread end
            log.exception("worker thread %d stopped by an unexpected error", index)
            self.report(exc)

    def _thread_loop(self, index: int, aio: AsyncSlot | None) -> None:
        slot = self.watchdog.slot(index)
        if aio is not None:
            aio.enter()
            aio.watch(slot)
        executor = BatchExecutor(
            self.context,
            self.strategy,
            f"{self.plan.worker_name}:{index}",
            watchdog=self.watchdog,
            slot=slot,
            default_timeout=self.plan.job_timeout,
            job_log=JobLog(self.job_log_writer) if self.job_log_writer is not None else None,
            notifier=self.notifier,
            aio=aio,
            leases=self.leases,
        )
        state = _ThreadState(
            turn=index,
            idle=self.plan.min_poll_interval,
            early_seen=self.run_state.early_wakes,
            engine=self.engine if aio is None else aio.engine.sync_engine,
            waits=(Waits if aio is None else LoopWaits)(
                lambda: self.run_state.stopping, self.run_state.stop_requested
            ),
        )
        try:
            while not self.run_state.stopping and self.run_state.budget_left():
                seen = self.run_state.signal.generation
                if self.run_state.early_wakes != state.early_seen:
                    state.early_seen, state.recheck = self.run_state.early_wakes, EARLY_WAKE_FIRST
                outcome = self._guarded_round(state, executor, slot)
                if outcome is None:  # an error, already backed off from: go round again
                    continue
                claimed, seconds = outcome
                state.turn += 1
                if claimed:
                    self._after_work(state, claimed, seconds)
                    continue
                if self.plan.burst:
                    break
                self._wait_idle(state, seen)
        finally:
            if state.polling:
                self.run_state.idle_poller.release()
            self.watchdog.forget(slot)
            _discard(state.conn, broken=slot.abandoned)

    def _guarded_round(
        self, state: _ThreadState, executor: BatchExecutor, slot: Slot
    ) -> tuple[int, float] | None:
        """One round; after an error, log and back off and return None. Missing tables stop
        the whole worker: no retry can fix them."""
        try:
            if state.conn is None:
                state.conn = state.engine.connect()
            outcome = self._round(state, state.conn, executor)
        except SchemaMissingError as exc:
            self.run_state.fail(exc)
            return None
        except Exception as exc:  # database gone, deadlock, bug: log, back off, go on
            if slot.abandoned:
                raise Abandoned from None
            lost = state.conn is not None and state.conn.invalidated
            state.conn = _discard(state.conn, broken=True)
            state.failures += 1
            self._after_error(exc, state, lost)
            return None
        state.failures = 0
        return outcome

    def _after_work(self, state: _ThreadState, claimed: int, seconds: float) -> None:
        if state.polling:  # work again: another idle thread takes over the polling
            state.polling = False
            self.run_state.idle_poller.release()
        if claimed >= state.batch:  # a full batch: there may be more, wake a helper
            self.run_state.signal.wake()
        state.woken = False
        fast = seconds / claimed < FAST_JOB_SECONDS
        state.batch = min(self.plan.batch_size, state.batch * 2) if fast else 1
        state.idle = self.plan.min_poll_interval

    def _wait_idle(self, state: _ThreadState, seen: int) -> None:
        """Nothing to claim: one idle thread polls for all, the others wait for it (or a push).
        A wake-up that found nothing may have been for a job due later, and so may an early
        one (this thread's own commit may have sent it): the poller reads the due time again."""
        state.batch = 1
        run_state = self.run_state
        if state.woken or state.recheck <= EARLY_WAKE_LAST:
            run_state.look_again()
        state.polling = state.polling or run_state.idle_poller.acquire(blocking=False)
        if state.slots_full:  # look again soon, as a database without push wake-ups would
            state.idle = min(state.idle, SLOTS_FULL_POLL)
        if state.polling:
            woken = self._poll_wait(state, seen)
        else:
            state.recheck = EARLY_WAKE_LAST * 2  # the poller follows early wake-ups up
            timeout = max(FOLLOWER_WAIT, self.plan.poll_interval)
            woken = state.waits.signal(run_state.signal, seen, timeout)
        state.woken = woken
        poll_interval = self.plan.poll_interval
        state.idle = self.plan.min_poll_interval if woken else min(state.idle * 2, poll_interval)

    def _poll_wait(self, state: _ThreadState, seen: int) -> bool:
        """The idle poller's sleep: until a wake-up, its poll, or the next job falls due —
        planned again whenever this process learns of an earlier due time (a retry it
        scheduled, a wake-up that found nothing, an early one). True if woken."""
        assert state.conn is not None
        run_state, signal = self.run_state, self.run_state.signal
        run_state.forget_passed(time.monotonic())
        until = time.monotonic() + state.idle
        # Where inserts push wake-ups nothing else would wake the worker for a job due later.
        ask = self.notifier.pushes and state.idle >= SHORT_SLEEP
        while True:
            replans = signal.replans
            if run_state.early_wakes != state.early_seen:
                state.early_seen, state.recheck = run_state.early_wakes, EARLY_WAKE_FIRST
            if state.recheck <= EARLY_WAKE_LAST:  # an early wake-up's job may be due later
                until = min(until, time.monotonic() + state.recheck)
                ask, state.recheck = True, state.recheck * 2
            until = min(until, self._next_due(state.conn, ask))
            left = max(0.0, until - time.monotonic())
            if state.waits.signal(signal, seen, left, replans):
                return True
            if signal.replans == replans:
                return False
            ask = False

    def _next_due(self, conn: Connection, ask: bool) -> float:
        """When the next job falls due (monotonic; infinity: none known): the earliest this
        process scheduled, and the database's when ``ask`` or something changed."""
        known, changed = self.run_state.next_due()
        soonest = math.inf if known is None else known
        if not (ask or changed):
            return soonest
        try:
            due = self.context.queue_engine(conn).queries.next_due_in(conn, self.plan.queues)
            conn.rollback()
        except Exception:  # only an optimisation: fall back to the poll interval
            log.debug("could not read the next due time", exc_info=True)
            return soonest
        if due is None:
            return soonest
        self.run_state.due_in(due + 0.001, replan=False)  # known until it passes
        return min(soonest, time.monotonic() + due + 0.001)

    def _round(
        self, state: _ThreadState, conn: Connection, executor: BatchExecutor
    ) -> tuple[int, float]:
        """Claim from each queue in turn (starting at a different one each round); the jobs
        run, and the seconds their handlers took — not the claims' and commits', which a
        loaded database stretches: counted, they would shrink batches to one job, and the
        extra round trips would load it more."""
        engine = self.context.queue_engine(conn)
        claimed = 0
        seconds = 0.0
        state.slots_full = False
        queues = self.plan.queues
        for offset in range(len(queues)):
            if self.run_state.stopping:
                break
            queue = queues[(state.turn + offset) % len(queues)]
            limit = self.run_state.reserve(state.batch)
            if limit == 0:
                break
            result: BatchResult | None = None
            committed = False
            reserved = [limit]  # and what gathering a batch task's jobs adds

            def reserve(more: int, reserved: list[int] = reserved) -> int:
                granted = self.run_state.reserve(more)
                reserved[0] += granted
                return granted

            try:
                result = self._claim_and_run(conn, executor, engine, queue, limit, state, reserve)
                committed = True
            finally:
                self.run_state.settle(reserved[0], result if committed else None)
            if result is not None:
                claimed += result.succeeded + result.failed + result.cancelled
                seconds += result.handler_seconds
        self.run_state.summary.rounds += 1
        return claimed, seconds

    def _claim_and_run(
        self,
        conn: Connection,
        executor: BatchExecutor,
        engine: Any,
        queue: str,
        limit: int,
        state: _ThreadState,
        reserve: Callable[[int], int],
    ) -> BatchResult | None:
        strategy = self.strategy
        worker_id = executor.worker_id
        limits = self.plan.queue_limits
        slots = limits.get(queue) if limits else None
        if slots is None:

            def claim() -> list[Any]:
                jobs = strategy.claim(conn, engine.claims, queue, limit, worker_id)
                if not jobs or not self.context.registry.has_batches:
                    return jobs
                return gather(
                    strategy,
                    self.context.registry,
                    conn,
                    engine,
                    queue,
                    jobs,
                    worker_id,
                    reserve=reserve,
                    stopping=lambda: self.run_state.stopping,
                    pause=lambda seconds: state.waits.backoff(self.run_state.signal, seconds),
                )

            return claim_and_run(
                executor, conn, engine, self._handing_over(state, claim), self._stopping
            )
        return claim_and_run(
            executor,
            conn,
            engine,
            self._handing_over(
                state,
                lambda: self._claim_limited(conn, engine, queue, limit, slots, state, worker_id),
            ),
            self._stopping,
        )

    def _stopping(self) -> bool:
        return self.run_state.stopping

    def _handing_over(
        self, state: _ThreadState, claim: Callable[[], list[Job]]
    ) -> Callable[[], list[Job]]:
        """``claim``, after which the idle poller that got jobs hands its role over before
        running them: held through a long job, it would leave the other idle threads asleep
        until their safety net, blind to the due times it no longer watches."""

        def claim_and_hand_over() -> list[Job]:
            jobs = claim()
            if jobs and state.polling:
                state.polling = False
                self.run_state.idle_poller.release()
                self.run_state.signal.wake()  # an idle thread (if any) takes the role
            return jobs

        return claim_and_hand_over

    def _claim_limited(
        self,
        conn: Connection,
        engine: Any,
        queue: str,
        limit: int,
        slots: int,
        state: _ThreadState,
        worker_id: str,
    ) -> list[Any]:
        """A limited queue's claim: a slot first (the strategy's kind of lock), then as many
        jobs as the slot allows. All slots taken: nothing, and the thread notes it so that its
        idle wait stays short (a slot frees without any push: a job ends, a holder dies)."""
        jobs = self.strategy.claim_limited(conn, engine.claims, queue, limit, worker_id, slots)
        if jobs is None:
            state.slots_full = True
            return []
        return jobs

    # ---- helpers ------------------------------------------------------------------------------
    def _after_error(self, exc: Exception, state: _ThreadState, lost: bool = False) -> None:
        """Back off after a failed round. ``lost``: the connection broke (whatever the error
        that surfaced, e.g. a handler's own exception about it): a database error, not a bug."""
        failures = state.failures
        if self.strategy.dialect.is_transient(exc):
            log.info("transaction retried after a transient error: %s", _first_line(exc))
            state.waits.sleep(random.uniform(0.01, 0.1))
            return
        if isinstance(exc, LockServerUnavailableError):
            # The request already waited for the connection (which reconnects with its own
            # backoff): retry soon, so that work resumes as soon as the server is back.
            if failures == 1 or failures % 10 == 0:
                log.warning("%s; claims resume once it is back", exc)
                self.report(exc)
            state.waits.backoff(self.run_state.signal, random.uniform(0.2, 0.6))
            return
        delay = min(MAX_RECONNECT_DELAY, 0.5 * 2 ** (failures - 1)) * random.uniform(0.8, 1.2)
        # A driver that connects outside the DBAPI's errors (asyncpg: the socket's own
        # ConnectionRefusedError while the server restarts) reports a database error too.
        if (
            isinstance(exc, (sa.exc.DBAPIError, ConnectionError))
            or lost
            or self.strategy.dialect.connection_lost(exc)
        ):
            orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
            log.warning("database error (%s); reconnecting in %.1fs", _first_line(orig), delay)
        else:
            log.error("unexpected error in the worker loop; retrying in %.1fs", delay, exc_info=exc)
        self.report(exc)
        self.run_state.count_reconnect()
        state.waits.backoff(self.run_state.signal, delay)


def claim_and_run(
    executor: BatchExecutor,
    conn: Connection,
    engine: QueueEngine,
    claim: Callable[[], list[Job]],
    should_stop: Callable[[], bool],
) -> BatchResult | None:
    """Claim with ``claim`` (a call of the executor's strategy) and run the jobs; None when it
    got nothing. An in-transaction claim runs and commits in one transaction; a committed
    claim's jobs are given back, and their locks released, if running them fails. Jobs of
    tasks that run outside their claim's transaction are put under a lease by the claim's
    transaction (or one of their own) and run after it committed."""
    strategy = executor.strategy
    if strategy.claims_in_transaction:
        with conn.begin():
            jobs = claim()
            if not jobs:
                return None
            held, leased = executor.leased.take(conn, engine, jobs)
            done = executor.execute(conn, engine, held, should_stop) if held else BatchResult()
        executor.after_commit()
        return _run_leased(executor, conn, engine, leased, should_stop, done)
    jobs = claim()  # commits 'running'
    if not jobs:
        return None
    try:
        held, leased = executor.leased.take(conn, engine, jobs)
        result = (
            executor.execute_committed(conn, engine, held, should_stop) if held else BatchResult()
        )
    except Abandoned:
        raise  # the watchdog recorded the outcome; this thread writes nothing more
    except BaseException:
        executor.give_back(conn, engine, jobs)
        try:
            strategy.release(conn, engine.claims, jobs)
        except Exception:  # the original error says more; rescue frees what is left
            log.debug("releasing the locks of a failed batch failed", exc_info=True)
        raise
    if held:
        strategy.release(conn, engine.claims, held, jobs_released=result.released)
    return _run_leased(executor, conn, engine, leased, should_stop, result)


def _run_leased(
    executor: BatchExecutor,
    conn: Connection,
    engine: QueueEngine,
    leased: list[Job],
    should_stop: Callable[[], bool],
    done: BatchResult,
) -> BatchResult:
    """Run the claim's leased jobs (none: ``done`` as it is), adding up their results."""
    if not leased:
        return done
    try:
        ran = executor.leased.run(conn, engine, leased, should_stop)
    except Abandoned:
        raise
    except BaseException:
        executor.give_back(conn, engine, leased, executor.leased.fence)
        try:
            executor.strategy.release(conn, engine.claims, leased)
        except Exception:
            log.debug("releasing the locks of a failed leased batch failed", exc_info=True)
        raise
    done.succeeded += ran.succeeded
    done.failed += ran.failed
    done.cancelled += ran.cancelled
    done.skipped += ran.skipped
    done.handler_seconds += ran.handler_seconds
    return done

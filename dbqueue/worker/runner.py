"""The worker process: N threads, each with its own connection, claiming and running batches."""

from __future__ import annotations

import logging
import os
import queue as queue_module
import random
import signal
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from .. import dialects, strategies
from ..config import redact
from ..errors import ConfigurationError, DatabaseUnavailableError, SchemaMissingError
from ..identifiers import check_queue_name
from ..job import Job
from ..lockserver.client import LockServerUnavailableError
from ..maintenance import Maintenance, MaintenanceSettings
from ..migrate import check_schema
from ..wakeup import Notifier, WakeSignal
from .executor import BatchExecutor, BatchResult, timeout_message
from .watchdog import DEFAULT_TIMEOUT_GRACE, Abandoned, Slot, Watchdog

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("dbqueue.worker")

DEFAULT_BATCH_SIZE = 10
#: Idle polling starts this short after a busy spell and doubles up to the poll interval.
DEFAULT_MIN_POLL_INTERVAL = 0.05
#: Longest idle sleep where nothing pushes wake-ups (MySQL, SQLite).
DEFAULT_POLL_INTERVAL = 1.0
#: Longest idle sleep where inserts push a wake-up (PostgreSQL NOTIFY, the lock server): only a
#: lost notification waits this long (the seed's QUEUE_WAIT_NOTIFY_INTERVAL).
DEFAULT_PUSH_POLL_INTERVAL = 30.0
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
#: While a queue is empty one idle thread polls for all; the others wait for it to find work
#: (or for a push), with this long a safety net.
FOLLOWER_WAIT = 30.0


@dataclass
class WorkerSummary:
    succeeded: int = 0
    failed: int = 0
    rounds: int = 0
    reconnects: int = 0
    #: threads given up because a handler stayed blocked past its timeout (each was replaced)
    abandoned_threads: int = 0
    started_at: float = field(default_factory=time.monotonic)

    @property
    def processed(self) -> int:
        return self.succeeded + self.failed


class Worker:
    """Claims and runs jobs until stopped.

    queues: queues to consume, in turn (default: QUEUE_NAME or 'default', plus every queue a
        registered task names). concurrency: threads, each with its own connection and batch
        transaction. burst: exit once nothing is runnable. max_jobs / max_runtime: stop claiming
        after that many jobs / seconds, finish what is running, exit. batch_size: most jobs one
        claim takes (it adapts down to 1 for slow handlers). poll_interval: longest idle sleep
        (default 1 s, or 30 s where inserts push wake-ups); min_poll_interval: the first idle
        sleep after work. strategy: claim strategy (default: the database's); lock_server:
        "HOST:PORT" of ``dbqueue server`` for the lock_server strategy (default: the App's).
        maintenance: run the leader-elected purge/rescue/re-notify routines (settings:
        ``maintenance_settings``). job_timeout: seconds a job may run unless its task sets
        ``timeout`` (default DBQUEUE_JOB_TIMEOUT, else none); timeout_grace: how long a handler
        that ignores the JobTimeoutError (blocked in C) may stay before its thread is abandoned
        and replaced.
    """

    def __init__(
        self,
        app: App,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 1,
        burst: bool = False,
        max_jobs: int | None = None,
        max_runtime: float | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        poll_interval: float | None = None,
        min_poll_interval: float = DEFAULT_MIN_POLL_INTERVAL,
        strategy: str | None = None,
        lock_server: str | None = None,
        maintenance: bool = True,
        maintenance_settings: MaintenanceSettings | None = None,
        install_signal_handlers: bool = True,
        name: str | None = None,
        job_timeout: float | None = None,
        timeout_grace: float = DEFAULT_TIMEOUT_GRACE,
    ) -> None:
        self.app = app
        self.queues = self._resolve_queues(queues)
        self.concurrency = _positive_int("concurrency", concurrency)
        self.batch_size = _positive_int("batch_size", batch_size)
        self.burst = burst
        self.max_jobs = None if max_jobs is None else _positive_int("max_jobs", max_jobs)
        self.max_runtime = _positive_seconds("max_runtime", max_runtime)
        self.poll_interval = _positive_seconds("poll_interval", poll_interval)
        self.min_poll_interval = _positive_seconds("min_poll_interval", min_poll_interval)
        self.strategy_name = strategy or app.settings.strategy
        self.settings = app.settings.merged(lock_server=lock_server, notify_server=lock_server)
        self.run_maintenance = maintenance and not burst
        self.maintenance_settings = maintenance_settings or app.maintenance_settings
        self.install_signal_handlers = install_signal_handlers
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.job_timeout = _positive_seconds(
            "job_timeout", app.settings.job_timeout if job_timeout is None else job_timeout
        )
        self.timeout_grace = _positive_seconds("timeout_grace", timeout_grace)
        self.watchdog: Watchdog | None = None
        self._abandoned: queue_module.SimpleQueue[Slot] = queue_module.SimpleQueue()
        self.summary = WorkerSummary()
        self._stop = threading.Event()
        self._signal = WakeSignal()
        self._early_wakes = 0
        self._idle_poller = threading.Lock()  # held by the idle thread that polls for the rest
        self._lock = threading.Lock()
        self._reserved = 0
        self._deadline: float | None = None
        self._fatal: BaseException | None = None
        self._engine: Engine | None = None
        self.strategy: strategies.ClaimStrategy | None = None
        self.notifier: Notifier | None = None
        self.maintenance: Maintenance | None = None

    # ---- control ------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop claiming; running jobs finish, then run() returns."""
        self._stop.set()
        self._signal.wake(everyone=True)

    def wake(self, early: bool = False) -> None:
        """Make idle threads claim now instead of at the end of their poll interval.

        ``early``: the work is not committed yet (SQLAlchemy Core signals a Connection's commit
        only before it happens): threads that find nothing look again a few times, soon.
        """
        if early:
            self._early_wakes += 1
        self._signal.wake()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set() or (
            self._deadline is not None and time.monotonic() >= self._deadline
        )

    # ---- main ---------------------------------------------------------------------------------
    def run(self) -> WorkerSummary:
        self._engine = self.app.create_engine(
            pool_size=self.concurrency + 2,
            # Unbounded overflow: a thread abandoned past its timeout keeps its (ended)
            # connection checked out for as long as it stays blocked, and its replacement
            # must still get one.
            max_overflow=-1 if self._uses_timeouts() else 2,
            execution_options={dialects.WRITE_INTENT: True},
        )
        self.app.local_workers.add(self)
        try:
            self._start_up()
            if self.max_runtime is not None:
                self._deadline = time.monotonic() + self.max_runtime
            with self._signals():
                self._supervise()
        finally:
            self.app.local_workers.discard(self)
            self._shut_down()
        if self._fatal is not None:
            raise self._fatal
        log.info(
            "worker %s stopped: %d succeeded, %d failed",
            self.name,
            self.summary.succeeded,
            self.summary.failed,
        )
        return self.summary

    def _start_up(self) -> None:
        assert self._engine is not None
        try:
            with self._engine.connect() as conn:
                dialect = dialects.for_sqlalchemy(conn.dialect)
                dialect.check_connection(conn)
                check_schema(conn, self.app.names)
        except sa.exc.DBAPIError as exc:
            raise DatabaseUnavailableError(
                f"cannot connect to {redact(self.app.url)}: {_first_line(exc.orig)} "
                "(check --url / DBQUEUE_URL, that the server is running, and the credentials)"
            ) from None
        self.strategy = strategies.create(self.strategy_name, dialect, self.settings)
        if not dialect.supports_savepoints and self.batch_size > 1:
            # Each job of a batch needs a savepoint of its own to fail alone; without them every
            # job gets a transaction of its own.
            log.info("%s has no savepoints: one job per transaction", dialect.server_description)
            self.batch_size = 1
        if self.app.registry.is_empty():
            log.warning(
                "no tasks registered (pass --app module:app): only webhook deliveries can "
                "run; every other job claimed will fail as unknown"
            )
        self.notifier = self.strategy.notifier(self._engine, self.app.names) or dialect.notifier(
            self._engine, self.app.names.qualified_jobs
        )
        if self.poll_interval is None:
            settings = self.settings
            if self.notifier.pushes:
                self.poll_interval = settings.wait_notify_interval or DEFAULT_PUSH_POLL_INTERVAL
            else:
                self.poll_interval = settings.poll_interval or DEFAULT_POLL_INTERVAL
        if not self.burst:
            self.notifier.start(self._signal.wake, self.queues)
        if self.run_maintenance:
            self.maintenance = Maintenance(
                self.app,
                self._engine,
                self.strategy,
                self.notifier,
                self.maintenance_settings,
                f"{self.name}:maintenance",
            )
            self.maintenance.start()
        log.info(
            "worker %s on %s: strategy %s, queues %s, concurrency %d, %s",
            self.name,
            dialect.server_description,
            self.strategy.name,
            ", ".join(self.queues),
            self.concurrency,
            "push wake-ups" if self.notifier.pushes else "polling",
        )

    def _uses_timeouts(self) -> bool:
        return self.job_timeout is not None or self.app.registry.has_timeouts()

    def _supervise(self) -> None:
        """Start the threads and wait for them; replace any the watchdog gave up on."""
        if self._uses_timeouts():
            self.watchdog = Watchdog(self.timeout_grace, self._on_stuck)
            self.watchdog.start()
        live: dict[int, threading.Thread] = {}
        for index in range(self.concurrency):
            live[index] = self._start_thread(index)
        next_index = self.concurrency
        while live:
            for index, thread in list(live.items()):
                thread.join(0.2 / len(live))
                if not thread.is_alive():
                    del live[index]
            while not self._abandoned.empty():
                slot = self._abandoned.get()
                live.pop(slot.index, None)  # left blocked; a daemon, so it cannot hold up exit
                if not self.stopping:
                    live[next_index] = self._start_thread(next_index)
                    next_index += 1

    def _start_thread(self, index: int) -> threading.Thread:
        # Daemon threads: a live worker's threads are all joined above before run() returns;
        # only an abandoned one (blocked in C past its timeout) is left for the exit to end.
        thread = threading.Thread(
            target=self._thread_main, args=(index,), name=f"dbqueue-worker-{index}", daemon=True
        )
        thread.start()
        return thread

    def _on_stuck(self, slot: Slot) -> None:
        """A handler stayed blocked past its timeout and the grace period (watchdog thread).

        Its thread is already marked abandoned, so it will never write again. End its database
        connection, so that its transaction rolls back and its claim (row lock, advisory lock,
        SQLite's write lock) is released; record the timed-out attempt in a transaction of our
        own; ask the supervisor for a replacement thread.
        """
        assert self._engine is not None and self.strategy is not None
        job = slot.job
        assert job is not None
        log.error(
            "job %s (%s) is still running %.1fs after its %.1fs timeout, blocked where "
            "JobTimeoutError cannot reach it (C code: a sleep, a socket read, a lock): "
            "abandoning thread %d, ending its database connection, starting a replacement",
            job.id,
            job.task,
            self.timeout_grace,
            slot.timeout,
            slot.index,
        )
        with self._lock:
            self.summary.abandoned_threads += 1
        try:
            self._end_connection(slot)
            self._record_abandoned(slot, job)
        finally:
            self._abandoned.put(slot)
            self._signal.wake()

    def _end_connection(self, slot: Slot) -> None:
        assert self._engine is not None and self.strategy is not None
        fairy = getattr(slot.connection, "connection", None) if slot.connection else None
        dbapi_connection = getattr(fairy, "dbapi_connection", None)
        if dbapi_connection is None:
            return
        try:
            ended = self.strategy.dialect.end_connection(self._engine, dbapi_connection)
        except Exception as exc:
            log.warning("could not end the stuck thread's connection: %s", _first_line(exc))
            return
        if not ended:
            log.warning(
                "%s cannot end another connection: the stuck job's claim is held until its "
                "handler returns",
                self.strategy.dialect.server_description,
            )

    def _record_abandoned(self, slot: Slot, job: Job) -> None:
        assert self._engine is not None and self.strategy is not None
        executor = BatchExecutor(
            self.app.registry, self.strategy, self.app.backoff, f"{self.name}:watchdog"
        )
        message = (
            f"{timeout_message(job, slot.timeout)}; it did not stop within "
            f"{self.timeout_grace!r} s more (blocked in C code), so its thread was abandoned and "
            "its database connection ended: its database writes were rolled back, but work "
            "outside the database may still happen if the blocked code resumes"
        )
        worker_id = f"{self.name}:{slot.index}"
        others = [other for other in slot.batch if other is not job]
        for attempt in range(5):
            try:
                with self._engine.connect() as conn:
                    engine = self.app.queue_engine(conn)
                    committed = not self.strategy.claims_in_transaction
                    with conn.begin():
                        executor.record_failure(
                            conn,
                            engine,
                            job,
                            f"JobTimeoutError: {message}",
                            claimed_by=worker_id if committed else None,
                            guarded=True,
                        )
                        if committed:
                            engine.release_claims(conn, others, claimed_by=worker_id)
                    self.strategy.release_abandoned(engine, slot.batch, slot.thread_id)
                break
            except Exception as exc:
                if attempt == 4:
                    raise
                log.warning("recording the timed-out job failed (%s); retrying", _first_line(exc))
                time.sleep(0.5 * (attempt + 1))
        with self._lock:
            self.summary.failed += 1

    def _shut_down(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.maintenance is not None:
            self.maintenance.stop()
        if self.notifier is not None:
            self.notifier.stop()
        if self.strategy is not None:
            self.strategy.close()
        if self._engine is not None:
            self._engine.dispose()

    def _thread_main(self, index: int) -> None:
        try:
            self._thread_loop(index)
        except Abandoned:
            log.info("abandoned worker thread %d unblocked and ended without writing", index)
        except BaseException:  # a bug: say so, and let the supervisor see the thread end
            log.exception("worker thread %d stopped by an unexpected error", index)

    def _thread_loop(self, index: int) -> None:
        assert self.strategy is not None and self._engine is not None
        slot = self.watchdog.slot(index) if self.watchdog is not None else None
        executor = BatchExecutor(
            self.app.registry,
            self.strategy,
            self.app.backoff,
            f"{self.name}:{index}",
            watchdog=self.watchdog,
            slot=slot,
            default_timeout=self.job_timeout,
        )
        conn: Connection | None = None
        failures = 0
        batch = 1
        turn = index
        idle = self.min_poll_interval
        early_seen = self._early_wakes
        recheck = EARLY_WAKE_LAST * 2  # no early wake pending
        polling = False  # this thread is the idle poller
        try:
            while not self.stopping and self._budget_left():
                seen = self._signal.generation
                if self._early_wakes != early_seen:
                    early_seen, recheck = self._early_wakes, EARLY_WAKE_FIRST
                try:
                    if conn is None:
                        conn = self._engine.connect()
                    claimed, seconds = self._round(conn, executor, batch, turn)
                    failures = 0
                except SchemaMissingError as exc:
                    self._fatal = exc
                    self.stop()
                    break
                except Exception as exc:  # database gone, deadlock, bug: log, back off, go on
                    if slot is not None and slot.abandoned:
                        raise Abandoned from None
                    lost = conn is not None and conn.invalidated
                    conn = _discard(conn, broken=True)
                    failures += 1
                    self._after_error(exc, failures, lost)
                    continue
                turn += 1
                if claimed:
                    if polling:  # work again: another idle thread takes over the polling
                        polling = False
                        self._idle_poller.release()
                    if claimed >= batch:  # a full batch: there may be more, wake a helper
                        self._signal.wake()
                    fast = seconds / claimed < FAST_JOB_SECONDS
                    batch = min(self.batch_size, batch * 2) if fast else 1
                    idle = self.min_poll_interval
                    continue
                if self.burst:
                    break
                batch = 1
                polling = polling or self._idle_poller.acquire(blocking=False)
                if polling:
                    timeout = self._idle_timeout(conn, idle)
                    if recheck <= EARLY_WAKE_LAST:
                        timeout, recheck = min(timeout, recheck), recheck * 2
                else:
                    timeout = max(FOLLOWER_WAIT, self.poll_interval or 0.0)
                woken = self._signal.wait(seen, timeout)
                idle = self.min_poll_interval if woken else min(idle * 2, self.poll_interval)
        finally:
            if polling:
                self._idle_poller.release()
            if slot is not None:
                self.watchdog.forget(slot)  # type: ignore[union-attr]
            _discard(conn, broken=slot is not None and slot.abandoned)

    def _idle_timeout(self, conn: Connection, idle: float) -> float:
        """Where inserts push wake-ups, sleep no longer than until the next scheduled job:
        nothing else would wake the worker for it."""
        assert self.notifier is not None
        if not self.notifier.pushes or idle < SHORT_SLEEP:
            return idle
        try:
            due = self.app.queue_engine(conn).next_due_in(conn, self.queues)
            conn.rollback()
        except Exception:  # only an optimisation: fall back to the poll interval
            log.debug("could not read the next due time", exc_info=True)
            return idle
        return idle if due is None else min(idle, due + 0.001)

    def _round(
        self, conn: Connection, executor: BatchExecutor, batch: int, turn: int
    ) -> tuple[int, float]:
        """Claim from each queue in turn (starting at a different one each round)."""
        engine = self.app.queue_engine(conn)
        claimed = 0
        started = time.monotonic()
        for offset in range(len(self.queues)):
            if self.stopping:
                break
            queue = self.queues[(turn + offset) % len(self.queues)]
            limit = self._reserve(batch)
            if limit == 0:
                break
            result: BatchResult | None = None
            committed = False
            try:
                result = self._claim_and_run(conn, executor, engine, queue, limit)
                committed = True
            finally:
                self._settle(limit, result if committed else None)
            claimed += result.succeeded + result.failed if result else 0
        self.summary.rounds += 1
        return claimed, time.monotonic() - started

    def _claim_and_run(
        self, conn: Connection, executor: BatchExecutor, engine: Any, queue: str, limit: int
    ) -> BatchResult | None:
        assert self.strategy is not None
        worker_id = executor.worker_id
        if self.strategy.claims_in_transaction:
            with conn.begin():
                jobs = self.strategy.claim(conn, engine, queue, limit, worker_id)
                if not jobs:
                    return None
                return executor.execute(conn, engine, jobs, lambda: self.stopping)
        jobs = self.strategy.claim(conn, engine, queue, limit, worker_id)  # commits 'running'
        if not jobs:
            return None
        try:
            result = executor.execute_committed(conn, engine, jobs, lambda: self.stopping)
        except Abandoned:
            raise  # the watchdog recorded the outcome; this thread writes nothing more
        except BaseException:
            executor.give_back(conn, engine, jobs)
            try:
                self.strategy.release(conn, engine, jobs)
            except Exception:  # the original error says more; rescue frees what is left
                log.debug("releasing the locks of a failed batch failed", exc_info=True)
            raise
        self.strategy.release(conn, engine, jobs)
        return result

    # ---- helpers ------------------------------------------------------------------------------
    def _after_error(self, exc: Exception, failures: int, lost: bool = False) -> None:
        """Back off after a failed round. ``lost``: the connection broke (whatever the error
        that surfaced, e.g. a handler's own exception about it): a database error, not a bug."""
        dialect = self.strategy.dialect if self.strategy else None
        if dialect is not None and dialect.is_transient(exc):
            log.info("transaction retried after a transient error: %s", _first_line(exc))
            time.sleep(random.uniform(0.01, 0.1))
            return
        if isinstance(exc, LockServerUnavailableError):
            # The request already waited for the connection (which reconnects with its own
            # backoff): retry soon, so that work resumes as soon as the server is back.
            if failures == 1 or failures % 10 == 0:
                log.warning("%s; claims resume once it is back", exc)
            self._stop.wait(random.uniform(0.2, 0.6))
            return
        delay = min(MAX_RECONNECT_DELAY, 0.5 * 2 ** (failures - 1)) * random.uniform(0.8, 1.2)
        if isinstance(exc, sa.exc.DBAPIError) or lost:
            orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
            log.warning("database error (%s); reconnecting in %.1fs", _first_line(orig), delay)
        else:
            log.error("unexpected error in the worker loop; retrying in %.1fs", delay, exc_info=exc)
        with self._lock:
            self.summary.reconnects += 1
        self._stop.wait(delay)

    def _budget_left(self) -> bool:
        if self.max_jobs is None:
            return True
        with self._lock:
            return self.summary.processed + self._reserved < self.max_jobs

    def _reserve(self, wanted: int) -> int:
        if self.max_jobs is None:
            return wanted
        with self._lock:
            left = self.max_jobs - self.summary.processed - self._reserved
            granted = max(0, min(wanted, left))
            self._reserved += granted
            return granted

    def _settle(self, reserved: int, result: BatchResult | None) -> None:
        """Return a claim's reservation and count what it committed."""
        with self._lock:
            if self.max_jobs is not None:
                self._reserved -= reserved
            if result is not None:
                self.summary.succeeded += result.succeeded
                self.summary.failed += result.failed

    def _resolve_queues(self, queues: Sequence[str] | None) -> list[str]:
        if queues:
            chosen = list(dict.fromkeys(queues))
        else:
            chosen = list(dict.fromkeys([self.app.default_queue, *self.app.registry.queues()]))
        return [check_queue_name(q) for q in chosen]

    def _signals(self) -> _SignalHandlers:
        return _SignalHandlers(self if self.install_signal_handlers else None)


class _SignalHandlers:
    """SIGTERM/SIGINT stop claiming and let running jobs finish (only from the main thread)."""

    def __init__(self, worker: Worker | None) -> None:
        self.worker = worker
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> None:
        if self.worker is None or threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.previous[signum] = signal.signal(signum, self._handle)

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        assert self.worker is not None
        log.info(
            "%s received: no new jobs will be claimed; waiting for running jobs to finish",
            signal.Signals(signum).name,
        )
        self.worker.stop()


def _discard(conn: Connection | None, broken: bool = False) -> None:
    """Close a connection; after an error also drop it from the pool, so that session state
    (advisory locks, an aborted transaction) dies with it instead of reaching another thread."""
    if conn is not None:
        try:
            if broken:
                conn.invalidate()
            conn.close()
        except Exception:  # the connection is already broken; nothing to save
            log.debug("closing a broken connection failed", exc_info=True)
    return None


def _first_line(exc: BaseException | None) -> str:
    text = str(exc).strip() if exc is not None else ""
    return text.splitlines()[0] if text else type(exc).__name__


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name}={value!r} must be a whole number of at least 1")
    return value


def _positive_seconds(name: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigurationError(f"{name}={value!r} must be a positive number of seconds")
    return float(value)

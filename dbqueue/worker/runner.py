"""The worker process: N threads, each with its own connection, claiming and running batches."""

from __future__ import annotations

import logging
import os
import queue as queue_module
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine

from dbqueue import dialects
from dbqueue.base.identifiers import check_queue_name
from dbqueue.base.limits import check_queue_limits
from dbqueue.base.wakeup import Notifier, WakeSignal
from dbqueue.config import MaintenanceSettings
from dbqueue.errors import ConfigurationError
from dbqueue.pubsub.subscriptions import subscription_problems
from dbqueue.runtime.commit_wake import CommitWaker
from dbqueue.runtime.context import RuntimeContext
from dbqueue.runtime.maintenance import Maintenance
from dbqueue.worker.aio import EventLoop, SlotHandle, start_slot
from dbqueue.worker.cancel_poller import CancelPoller
from dbqueue.worker.heartbeat import DEFAULT_HEARTBEAT_INTERVAL, Heartbeat
from dbqueue.worker.joblog import JobLogWriter
from dbqueue.worker.limit_slots import prepare_slots
from dbqueue.worker.loki import LokiShipper
from dbqueue.worker.loop import ClaimLoop
from dbqueue.worker.process import SignalHandlers, positive_int, positive_seconds
from dbqueue.worker.recovery import AbandonedThreads
from dbqueue.worker.scheduler import Scheduler
from dbqueue.worker.watchdog import CANCEL_NOTICE, DEFAULT_TIMEOUT_GRACE, Slot, Watchdog

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from dbqueue.strategies import ClaimStrategy

log = logging.getLogger("dbqueue.worker")

DEFAULT_BATCH_SIZE = 10
#: Idle polling starts this short after a busy spell and doubles up to the poll interval.
DEFAULT_MIN_POLL_INTERVAL = 0.05
#: Longest idle sleep where nothing pushes wake-ups (MySQL, SQLite).
DEFAULT_POLL_INTERVAL = 1.0
#: Longest idle sleep where inserts push a wake-up (PostgreSQL NOTIFY, the lock server): only a
#: lost notification waits this long (the seed's QUEUE_WAIT_NOTIFY_INTERVAL).
DEFAULT_PUSH_POLL_INTERVAL = 30.0
#: How often the supervising thread looks at its threads and the max-runtime deadline.
SUPERVISE_INTERVAL = 0.2


@dataclass
class WorkerSummary:
    succeeded: int = 0
    failed: int = 0
    #: jobs stopped by a cancel request while they ran (``app.cancel``)
    cancelled: int = 0
    rounds: int = 0
    reconnects: int = 0
    #: threads given up because a handler stayed blocked past its timeout (each was replaced)
    abandoned_threads: int = 0
    started_at: float = field(default_factory=time.monotonic)

    @property
    def processed(self) -> int:
        return self.succeeded + self.failed + self.cancelled


class Worker(ClaimLoop, AbandonedThreads):
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
        and replaced (also after a cancel request); cancel_notice: how long a handler told of a
        cancel request (``job.cancel_requested()``) may take to stop by itself before
        JobCancelledError is raised in its thread (default 1 s). log_jobs: one INFO line per
        finished job on logger ``dbqueue.jobs`` (task, job_id, queue, attempt, outcome,
        duration_ms; default DBQUEUE_LOG_JOBS, else off).
        periodic: enqueue the ticks of the App's periodic schedules (one thread; each tick
        exactly once across workers; not in burst mode). queue_limits: queue → N, at most N
        jobs of that queue running at once across all workers (added to the App's
        ``app.queue(name, concurrency=N)``, and winning over them). heartbeat_interval:
        seconds between the updates of the worker's row in the registry of live workers
        (``app.workers()``, ``dbqueue workers``); the row expires after four missed ones.
    """

    #: With async handlers: the event loop the slots run on, and their async engine.
    _loop: EventLoop | None = None
    _async_engine: AsyncEngine | None = None

    def __init__(
        self,
        app: Any,
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
        periodic: bool = True,
        install_signal_handlers: bool = True,
        name: str | None = None,
        job_timeout: float | None = None,
        timeout_grace: float = DEFAULT_TIMEOUT_GRACE,
        cancel_notice: float = CANCEL_NOTICE,
        log_jobs: bool | None = None,
        queue_limits: Mapping[str, int] | None = None,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
    ) -> None:
        base = app if isinstance(app, RuntimeContext) else app.context
        self.context = base.reconfigured(
            strategy=strategy, lock_server=lock_server, notify_server=lock_server
        )
        self.settings = self.context.settings
        self.queues, self.queue_limits = self._resolve_queues(queues, queue_limits)
        self.concurrency = positive_int("concurrency", concurrency)
        self.batch_size = positive_int("batch_size", batch_size)
        self.burst = burst
        self.max_jobs = None if max_jobs is None else positive_int("max_jobs", max_jobs)
        self.max_runtime = positive_seconds("max_runtime", max_runtime)
        self.poll_interval = positive_seconds("poll_interval", poll_interval)
        self.min_poll_interval = positive_seconds("min_poll_interval", min_poll_interval)
        self.run_maintenance = maintenance and not burst
        self.maintenance_settings = maintenance_settings or self.context.maintenance_settings
        self.run_periodic = periodic and not burst
        self.scheduler: Scheduler | None = None
        self.install_signal_handlers = install_signal_handlers
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.job_timeout = positive_seconds(
            "job_timeout", self.settings.job_timeout if job_timeout is None else job_timeout
        )
        self.timeout_grace = positive_seconds("timeout_grace", timeout_grace)
        self.cancel_notice = positive_seconds("cancel_notice", cancel_notice)
        self.log_jobs = self.settings.log_jobs if log_jobs is None else bool(log_jobs)
        self.heartbeat_interval = positive_seconds("heartbeat_interval", heartbeat_interval)
        self._init_run_state()

    def _init_run_state(self) -> None:
        """What ``run()`` starts, counts and signals with: nothing yet until it runs."""
        self.heartbeat: Heartbeat | None = None
        self.job_log_writer: JobLogWriter | None = None
        self.watchdog: Watchdog | None = None
        self.cancel_poller: CancelPoller | None = None
        self._abandoned: queue_module.SimpleQueue[Slot] = queue_module.SimpleQueue()
        self.summary = WorkerSummary()
        self.log_shipper: LokiShipper | None = None
        self._stop = threading.Event()
        self._signal = WakeSignal()
        self._early_wakes = 0
        self._idle_poller = threading.Lock()  # held by the idle thread that polls for the rest
        self._lock = threading.Lock()
        self._reserved = 0
        self._deadline: float | None = None
        self._fatal: BaseException | None = None
        self._engine: Engine | None = None
        self.strategy: ClaimStrategy | None = None
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
        """Run until stopped; with GRAFANA_URL, the log records of the run go to Loki."""
        self.log_shipper = LokiShipper.from_settings(self.settings)
        if self.log_shipper is None:
            return self._run()
        self.log_shipper.start()
        try:
            return self._run()
        finally:
            self.log_shipper.stop()

    def _run(self) -> WorkerSummary:
        self._engine = self.context.create_engine(
            pool_size=self.concurrency + 2,
            # Unbounded overflow: a thread abandoned past its timeout (or a cancel request)
            # keeps its (ended) connection checked out for as long as it stays blocked, and its
            # replacement must still get one.
            max_overflow=-1,
            execution_options={dialects.WRITE_INTENT: True},
        )
        if self.context.registry.has_async_handlers():
            self._async_engine = self.context.create_async_engine(
                pool_size=self.concurrency + 2,
                max_overflow=-1,
                execution_options={dialects.WRITE_INTENT: True},
            )
        self.context.local_workers.add(self)
        hooks = self.context.registry.hooks
        started = False
        try:
            # Installed before start-up: a SIGTERM that arrives while the worker registers
            # itself or starts its threads is a graceful stop, not the default (a kill).
            with self._signals():
                self._start_up()
                hooks.worker_started(self)
                started = True
                if self.max_runtime is not None:
                    self._deadline = time.monotonic() + self.max_runtime
                self._supervise()
        except Exception as exc:
            hooks.report(exc, self)
            raise
        finally:
            if started:
                hooks.worker_stopped(self)
            self.context.local_workers.discard(self)
            self._shut_down()
        if self._fatal is not None:
            hooks.report(self._fatal, self)
            raise self._fatal
        log.info(
            "worker %s stopped: %d succeeded, %d failed, %d cancelled",
            self.name,
            self.summary.succeeded,
            self.summary.failed,
            self.summary.cancelled,
        )
        return self.summary

    def _start_up(self) -> None:
        assert self._engine is not None
        observers = self.context.instruments.finished
        if self.log_jobs or observers:  # else the executor times nothing
            self.job_log_writer = JobLogWriter(self.context.retry_policy, observers, self.log_jobs)
            self.job_log_writer.start()
        dialect = self.context.check_database(self._engine)
        self.strategy = self.context.open_strategy(dialect)
        if not dialect.supports_savepoints and self.batch_size > 1:
            # Each job of a batch needs a savepoint of its own to fail alone; without them every
            # job gets a transaction of its own.
            log.info("%s has no savepoints: one job per transaction", dialect.server_description)
            self.batch_size = 1
        if self.context.registry.is_empty():
            log.warning(
                "no tasks registered (pass --app module:app): only webhook deliveries can "
                "run; every other job claimed will fail as unknown"
            )
        self._warn_about_subscriptions()
        prepare_slots(self.context, self._engine, self.queue_limits)
        self.notifier = self.context.notifier(self.strategy, self._engine)
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
                self.context,
                self._engine,
                self.strategy,
                self.notifier,
                self.maintenance_settings,
                f"{self.name}:maintenance",
            )
            self.maintenance.start()
        if self.run_periodic:
            self._start_scheduler()
        self._start_heartbeat()
        log.info(
            "worker %s on %s: strategy %s, queues %s, concurrency %d, %s",
            self.name,
            dialect.server_description,
            self.strategy.name,
            ", ".join(self.queues),
            self.concurrency,
            self.notifier.wake_mode,
        )

    def _start_heartbeat(self) -> None:
        """The worker's row in the registry of live workers, beaten by a thread of its own."""
        assert self._engine is not None and self.strategy is not None
        identity = {
            "name": self.name[:255],
            "queues": list(self.queues),
            "concurrency": self.concurrency,
            "strategy": self.strategy.name,
        }
        summary = self.summary
        self.heartbeat = Heartbeat(
            self.context,
            self._engine,
            identity,
            lambda: self.watchdog.running() if self.watchdog is not None else [],
            lambda: (summary.processed, summary.failed),
            self.heartbeat_interval or DEFAULT_HEARTBEAT_INTERVAL,
        )
        self.heartbeat.start()

    def _start_scheduler(self) -> None:
        """The periodic-jobs thread, when the App declares schedules (a schedule whose task
        cannot be resolved stops the start-up here, naming the fix)."""
        assert self._engine is not None
        schedules = self.context.registry.schedules.resolved(self.context.registry)
        if not schedules:
            return
        waker = CommitWaker(self.context)
        self.scheduler = Scheduler(
            self.context,
            self._engine,
            schedules,
            lambda queue, job_id: waker.after_commit(None, [queue]),
        )
        self.scheduler.start()
        log.info("periodic: %s", ", ".join(f"{s.name} ({s.cron})" for s in schedules))

    def _warn_about_subscriptions(self) -> None:
        """Subscribers with no subscription row, subscriptions nothing can deliver: said at
        start-up instead of discovered as missing or failed deliveries."""
        assert self._engine is not None
        with self._engine.connect() as conn:
            rows = self.context.subscriptions.find(conn)
        for problem in subscription_problems(rows, self.context.registry.subscribers()):
            log.warning("%s", problem)

    def _supervise(self) -> None:
        """Start the threads and wait for them; replace any the watchdog gave up on."""
        assert self._engine is not None
        # Always: timeouts, and the cancel requests any running job may get.
        self.watchdog = Watchdog(self.timeout_grace, self._on_stuck, self.cancel_notice)
        self.watchdog.start()
        self.cancel_poller = CancelPoller(
            self.watchdog, self._engine, self.context.cancel_requests()
        )
        self.cancel_poller.start()
        live: dict[int, threading.Thread | SlotHandle] = {}
        for index in range(self.concurrency):
            live[index] = self._start_thread(index)
        next_index = self.concurrency
        while live:
            if self._deadline is not None and time.monotonic() >= self._deadline:
                self.stop()  # wakes the threads asleep until their next poll, too
            for index, thread in list(live.items()):
                thread.join(SUPERVISE_INTERVAL / len(live))
                if not thread.is_alive():
                    del live[index]
            while not self._abandoned.empty():
                slot = self._abandoned.get()
                live.pop(slot.index, None)  # left blocked; a daemon, so it cannot hold up exit
                if not self.stopping:
                    live[next_index] = self._start_thread(next_index)
                    next_index += 1

    def _start_thread(self, index: int) -> threading.Thread | SlotHandle:
        if self._async_engine is not None:  # a slot on the event loop
            if self._loop is None:
                self._loop = EventLoop()
            return start_slot(self._loop, self._async_engine, index, self._thread_main)
        # Daemon threads: a live worker's threads are all joined above before run() returns;
        # only an abandoned one (blocked in C past its timeout) is left for the exit to end.
        thread = threading.Thread(
            target=self._thread_main, args=(index,), name=f"dbqueue-worker-{index}", daemon=True
        )
        thread.start()
        return thread

    def _shut_down(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()  # the row goes: this worker runs nothing any more
        if self.job_log_writer is not None:
            self.job_log_writer.stop()  # the threads have ended: write their last records
        if self.cancel_poller is not None:
            self.cancel_poller.stop()
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.scheduler is not None:
            self.scheduler.stop()
        self.context.cancel_requests().close()
        if self.maintenance is not None:
            self.maintenance.stop()
        if self.notifier is not None:
            self.notifier.stop()
        if self.strategy is not None:
            self.strategy.close()
        if self._engine is not None:
            self._engine.dispose()
        if self._loop is not None:
            self._loop.close(self._async_engine)
        if self.context.tenants is not None:
            self.context.tenants.dispose()

    def _resolve_queues(
        self, queues: Sequence[str] | None, limits: Mapping[str, int] | None
    ) -> tuple[list[str], dict[str, int]]:
        """The queues to consume, and the limits among them: the App's (``app.queue``), then
        the worker's own (``queue_limits`` / ``--queue-limit``), which win."""
        declared = self.context.registry.queue_limits
        given = check_queue_limits(limits or {})
        if queues:
            chosen = list(dict.fromkeys(queues))
        else:
            registered = [*self.context.registry.queues(), *declared, *given]
            chosen = list(dict.fromkeys([self.context.default_queue, *sorted(registered)]))
        chosen = [check_queue_name(q) for q in chosen]
        stray = [queue for queue in given if queue not in chosen]
        if stray:
            raise ConfigurationError(
                f"queue_limits / --queue-limit name queue(s) this worker does not consume: "
                f"{', '.join(stray)} (it consumes {', '.join(chosen)}): add them to its queues "
                "(--queue), or drop their limits"
            )
        merged = {**declared, **given}
        return chosen, {queue: merged[queue] for queue in chosen if queue in merged}

    def _signals(self) -> SignalHandlers:
        return SignalHandlers(self if self.install_signal_handlers else None)

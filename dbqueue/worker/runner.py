"""The worker process: N threads, each with its own connection, claiming and running batches.

The Worker puts the run together: its settings, the run state its parts share, the parts a
run starts (engines, strategy, notifier, background services) in one declared order, the claim
loop its threads run, and the threads themselves."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine

from dbqueue import dialects
from dbqueue.base.wakeup import Notifier
from dbqueue.pubsub.subscriptions import subscription_problems
from dbqueue.runtime.commit_wake import CommitWaker
from dbqueue.runtime.context import RuntimeContext
from dbqueue.runtime.maintenance import Maintenance
from dbqueue.worker.aio import EventLoop
from dbqueue.worker.heartbeat import DEFAULT_HEARTBEAT_INTERVAL, Heartbeat
from dbqueue.worker.joblog import JobLogWriter
from dbqueue.worker.leased import DEFAULT_LEASE_SECONDS, LeaseBook
from dbqueue.worker.lifecycle import Lifecycle, Starter, Stop
from dbqueue.worker.limit_slots import prepare_slots
from dbqueue.worker.loki import LokiShipper
from dbqueue.worker.loop import ClaimLoop, ClaimPlan
from dbqueue.worker.process import SignalHandlers, positive_seconds, seconds_or_zero
from dbqueue.worker.recovery import AbandonedThreads
from dbqueue.worker.scheduler import Scheduler
from dbqueue.worker.settings import (
    DEFAULT_POLL_INTERVAL,
    DEFAULT_PUSH_POLL_INTERVAL,
    WorkerSettings,
    check_lease,
    resolve_queues,
)
from dbqueue.worker.state import RunState, WorkerSummary
from dbqueue.worker.threads import WorkerThreads
from dbqueue.worker.watchdog import CancelPoller, Watchdog

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from dbqueue.strategies import ClaimStrategy

log = logging.getLogger("dbqueue.worker")

__all__ = ["Worker", "WorkerSettings", "WorkerSummary"]


class Worker:
    """Claims and runs jobs until stopped.

    ``Worker(app, **options)`` with the options of ``WorkerSettings`` (where they are
    described), or ``Worker(app, options=WorkerSettings(...))``; options given beside
    ``options`` replace its values. ``worker.options`` holds them; ``worker.settings`` is the
    App's settings, as the worker resolved them (its strategy and lock server included).
    """

    def __init__(self, app: Any, options: WorkerSettings | None = None, **given: Any) -> None:
        if options is None:
            options = WorkerSettings(**given)
        elif given:
            options = dataclasses.replace(options, **given)
        self.options = settings = options
        base = app if isinstance(app, RuntimeContext) else app.context
        self.context = base.reconfigured(
            strategy=settings.strategy,
            lock_server=settings.lock_server,
            notify_server=settings.lock_server,
        )
        self.settings = app_settings = self.context.settings
        lease = settings.lease_seconds or app_settings.lease_seconds or DEFAULT_LEASE_SECONDS
        #: The leased jobs this worker runs (``@app.task(transaction=False)``).
        self.leases = LeaseBook(check_lease(lease, settings.heartbeat_interval))
        self.name = settings.name or f"{socket.gethostname()}:{os.getpid()}"
        self.queues, self.queue_limits = resolve_queues(
            self.context, settings.queues, settings.queue_limits
        )
        self.concurrency = settings.concurrency
        #: 1 once start-up finds a database without savepoints (a transaction per job).
        self.batch_size = settings.batch_size
        #: Settled at start-up when not given: longer where inserts push wake-ups.
        self.poll_interval = settings.poll_interval
        self.job_timeout = positive_seconds(
            "job_timeout",
            app_settings.job_timeout if settings.job_timeout is None else settings.job_timeout,
        )
        self.log_jobs = (
            app_settings.log_jobs if settings.log_jobs is None else bool(settings.log_jobs)
        )
        self.shutdown_timeout = seconds_or_zero(
            "shutdown_timeout",
            app_settings.shutdown_timeout
            if settings.shutdown_timeout is None
            else settings.shutdown_timeout,
        )
        self.run_maintenance = settings.maintenance and not settings.burst
        self.run_periodic = settings.periodic and not settings.burst
        self.maintenance_settings = (
            settings.maintenance_settings or self.context.maintenance_settings
        )
        self.run_state = RunState(settings.max_jobs, self.shutdown_timeout)
        self._init_parts()
        self.lifecycle = Lifecycle(self._run_order())

    def _init_parts(self) -> None:
        """What a run starts: nothing yet until it runs."""
        #: The threads ran and ended (the run was not cut short by an error).
        self._ended = False
        self.log_shipper: LokiShipper | None = None
        self.async_engine: AsyncEngine | None = None
        self.event_loop: EventLoop | None = None
        self.engine: Engine | None = None
        self.strategy: ClaimStrategy | None = None
        self.notifier: Notifier | None = None
        self.maintenance: Maintenance | None = None
        self.scheduler: Scheduler | None = None
        self.abandoned_threads: AbandonedThreads | None = None
        self.watchdog: Watchdog | None = None
        self.cancel_poller: CancelPoller | None = None
        self.job_log_writer: JobLogWriter | None = None
        self.heartbeat: Heartbeat | None = None

    def _run_order(self) -> list[tuple[str, Starter]]:
        """Everything a run starts, in this order; the run ends by stopping, in the reverse
        order, what started. The heartbeat starts last, so that its registry row goes first
        (the worker runs nothing more); the job log writer stops next, after the threads ended,
        to write their last records. The engines, the event loop and the tenants' databases
        outlive all that uses them; the log shipper is there from the first record to the last,
        the worker's "stopped" line, said once every other part has stopped.
        """
        return [
            ("log shipper", self._start_log_shipper),
            ("last line", self._last_line),
            ("tenant databases", self._tenant_databases),
            ("event loop", self._start_event_loop),
            ("engine", self._open_engine),
            ("strategy", self._open_strategy),
            ("notifier", self._start_notifier),
            ("maintenance", self._start_maintenance),
            ("cancel requests", self._cancel_requests),
            ("scheduler", self._start_scheduler),
            ("watchdog", self._start_watchdog),
            ("cancel poller", self._start_cancel_poller),
            ("job log writer", self._start_job_log_writer),
            ("heartbeat", self._start_heartbeat),
        ]

    # ---- control ------------------------------------------------------------------------------
    def stop(self, now: bool = False) -> None:
        """Stop claiming; running jobs finish (for at most the shutdown timeout), then run()
        returns. ``now``: do not wait for them — they are abandoned, their connections ended
        (what they wrote rolls back), and they come back as a dead worker's jobs do."""
        self.run_state.stop(now)

    def wake(self, early: bool = False) -> None:
        """Make idle threads claim now instead of at the end of their poll interval.

        ``early``: the work is not committed yet (SQLAlchemy Core signals a Connection's commit
        only before it happens): threads that find nothing look again a few times, soon.
        """
        self.run_state.wake(early)

    def due_in(self, seconds: float) -> None:
        """A job falls due in ``seconds`` (a retry this process scheduled): the idle threads
        sleep no longer than that, whatever their poll interval."""
        self.run_state.due_in(seconds)

    @property
    def stopping(self) -> bool:
        return self.run_state.stopping

    @property
    def summary(self) -> WorkerSummary:
        return self.run_state.summary

    @property
    def abandoned_threads_running(self) -> int:
        """Threads given up on (a handler blocked past its timeout, or running when the worker
        stopped at once) that still run it: daemons, which the process's exit ends."""
        abandoned = self.abandoned_threads
        return 0 if abandoned is None else abandoned.still_running()

    # The options as attributes, as the Worker has always had them.
    burst = property(lambda self: self.options.burst)
    max_jobs = property(lambda self: self.options.max_jobs)
    max_runtime = property(lambda self: self.options.max_runtime)
    min_poll_interval = property(lambda self: self.options.min_poll_interval)
    install_signal_handlers = property(lambda self: self.options.install_signal_handlers)
    timeout_grace = property(lambda self: self.options.timeout_grace)
    cancel_notice = property(lambda self: self.options.cancel_notice)
    heartbeat_interval = property(lambda self: self.options.heartbeat_interval)

    # ---- main ---------------------------------------------------------------------------------
    def run(self) -> WorkerSummary:
        """Run until stopped: start the parts in their order, run the threads until they end,
        stop the parts in the reverse order."""
        # Installed before start-up: a SIGTERM that arrives while the worker registers itself
        # or starts its threads is a graceful stop, not the default (a kill); kept until its
        # parts have stopped, so that a signal then does not interrupt them.
        handler = self.stop if self.options.install_signal_handlers else None
        with SignalHandlers(handler, self.shutdown_timeout):
            try:
                self._run()
            finally:
                self.lifecycle.stop()
        if self.run_state.fatal is not None:
            raise self.run_state.fatal
        return self.summary

    def _run(self) -> None:
        hooks = self.context.registry.hooks
        self.context.local_workers.add(self)
        started = False
        try:
            self.lifecycle.start()
            _say_started(self)
            hooks.worker_started(self)
            started = True
            if self.options.max_runtime is not None:
                self.run_state.deadline = time.monotonic() + self.options.max_runtime
            self._threads().run(self.concurrency)
            self._ended = True
        except Exception as exc:
            hooks.report(exc, self)
            raise
        finally:
            if started:
                hooks.worker_stopped(self)
            self.context.local_workers.discard(self)
        if self.run_state.fatal is not None:
            hooks.report(self.run_state.fatal, self)

    def _threads(self) -> WorkerThreads:
        """The threads (or async slots), each running the claim loop."""
        assert self.engine is not None and self.strategy is not None
        assert self.notifier is not None and self.watchdog is not None
        assert self.abandoned_threads is not None and self.poll_interval is not None
        plan = ClaimPlan(
            worker_name=self.name,
            queues=tuple(self.queues),
            queue_limits=self.queue_limits,
            burst=self.options.burst,
            batch_size=self.batch_size,
            min_poll_interval=self.options.min_poll_interval,
            poll_interval=self.poll_interval,
            job_timeout=self.job_timeout,
        )
        hooks = self.context.registry.hooks
        claim_loop = ClaimLoop(
            self.context,
            plan,
            self.run_state,
            self.engine,
            self.strategy,
            self.notifier,
            self.watchdog,
            self.job_log_writer,
            report=lambda exc: hooks.report(exc, self),
            leases=self.leases,
        )
        watchdog, abandoned = self.watchdog, self.abandoned_threads
        return WorkerThreads(
            self.run_state,
            claim_loop.thread_main,
            abandoned.given_up,
            lambda why: abandoned.stop_at_once(*watchdog.abandon_all(), watchdog, why),
            self.event_loop,
            self.async_engine,
        )

    # ---- the parts, in their start order ------------------------------------------------------
    def _start_log_shipper(self) -> Stop | None:
        """With GRAFANA_URL, the run's log records go to Loki."""
        self.log_shipper = LokiShipper.from_settings(self.context.settings)
        return None if self.log_shipper is None else self.log_shipper.start().stop

    def _last_line(self) -> Stop:
        """The worker's last line, once the run ended (not on an error) and its parts stopped:
        nothing of the worker runs after it (a thread still blocked in an abandoned handler
        is a daemon)."""
        return lambda: _say_stopped(self)

    def _tenant_databases(self) -> Stop | None:
        tenants = self.context.tenants
        return None if tenants is None else tenants.dispose

    def _start_event_loop(self) -> Stop | None:
        """With async handlers: their engine, and the event loop their slots run on."""
        if not self.context.registry.has_async_handlers():
            return None
        engine = self.async_engine = self.context.create_async_engine(
            pool_size=self.concurrency + 2,
            max_overflow=-1,
            execution_options={dialects.WRITE_INTENT: True},
        )
        loop = self.event_loop = EventLoop()
        return lambda: loop.close(engine)

    def _open_engine(self) -> Stop:
        self.engine = self.context.create_engine(
            pool_size=self.concurrency + 2,
            # Unbounded overflow: a thread abandoned past its timeout (or a cancel request)
            # keeps its (ended) connection checked out for as long as it stays blocked, and its
            # replacement must still get one.
            max_overflow=-1,
            execution_options={dialects.WRITE_INTENT: True},
        )
        return self.engine.dispose

    def _open_strategy(self) -> Stop:
        """The claim strategy, once the database is found fit; what the worker is about to
        miss (no tasks, subscriptions nothing delivers) is said now."""
        assert self.engine is not None
        dialect = self.context.check_database(self.engine)
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
        prepare_slots(self.context, self.engine, self.queue_limits)
        return self.strategy.close

    def _warn_about_subscriptions(self) -> None:
        """Subscribers with no subscription row, subscriptions nothing can deliver: said at
        start-up instead of discovered as missing or failed deliveries."""
        assert self.engine is not None
        with self.engine.connect() as conn:
            rows = self.context.subscriptions.find(conn)
        for problem in subscription_problems(rows, self.context.registry.subscribers()):
            log.warning("%s", problem)

    def _start_notifier(self) -> Stop:
        """How idle threads learn of new work; it settles the longest idle sleep."""
        assert self.engine is not None and self.strategy is not None
        notifier = self.notifier = self.context.notifier(self.strategy, self.engine)
        if self.poll_interval is None:
            app_settings = self.context.settings
            if notifier.pushes:
                self.poll_interval = app_settings.wait_notify_interval or DEFAULT_PUSH_POLL_INTERVAL
            else:
                self.poll_interval = app_settings.poll_interval or DEFAULT_POLL_INTERVAL
        if not self.options.burst:
            notifier.start(self.run_state.signal.wake, self.queues)
        return notifier.stop

    def _start_maintenance(self) -> Stop | None:
        if not self.run_maintenance:
            return None
        assert self.engine is not None and self.strategy is not None
        assert self.notifier is not None
        self.maintenance = Maintenance(
            self.context,
            self.engine,
            self.strategy,
            self.notifier,
            self.maintenance_settings,
            f"{self.name}:maintenance",
        )
        return self.maintenance.start().stop

    def _cancel_requests(self) -> Stop:
        """Where cancel requests are read: closed once the cancel poller has stopped."""
        return lambda: self.context.cancel_requests().close()

    def _start_scheduler(self) -> Stop | None:
        """The periodic-jobs thread, when the App declares schedules (a schedule whose task
        cannot be resolved stops the start-up here, naming the fix)."""
        if not self.run_periodic:
            return None
        assert self.engine is not None
        schedules = self.context.registry.schedules.resolved(self.context.registry)
        if not schedules:
            return None
        waker = CommitWaker(self.context)
        self.scheduler = Scheduler(
            self.context,
            self.engine,
            schedules,
            lambda queue, job_id: waker.after_commit(None, [queue]),
        )
        self.scheduler.start()
        log.info("periodic: %s", ", ".join(f"{s.name} ({s.cron})" for s in schedules))
        return self.scheduler.stop

    def _start_watchdog(self) -> Stop:
        """Timeouts, and the cancel requests any running job may get; a thread it gives up on
        is recovered by ``abandoned_threads`` and replaced."""
        assert self.engine is not None and self.strategy is not None
        self.abandoned_threads = AbandonedThreads(
            self.context,
            self.name,
            self.options.timeout_grace,
            self.engine,
            self.strategy,
            self.run_state,
        )
        self.watchdog = Watchdog(
            self.options.timeout_grace,
            self.abandoned_threads.on_stuck,
            self.options.cancel_notice,
        )
        return self.watchdog.start().stop

    def _start_cancel_poller(self) -> Stop:
        assert self.engine is not None and self.watchdog is not None
        self.cancel_poller = CancelPoller(
            self.watchdog, self.engine, self.context.cancel_requests()
        )
        return self.cancel_poller.start().stop

    def _start_job_log_writer(self) -> Stop | None:
        """The per-job log line and the finished-job observers (metrics): else the executor
        times nothing."""
        observers = self.context.instruments.finished
        if not (self.log_jobs or observers):
            return None
        self.job_log_writer = JobLogWriter(self.context.retry_policy, observers, self.log_jobs)
        return self.job_log_writer.start().stop

    def _start_heartbeat(self) -> Stop:
        """The worker's row in the registry of live workers, beaten by a thread of its own."""
        assert self.engine is not None and self.strategy is not None
        identity = {
            "name": self.name[:255],
            "queues": list(self.queues),
            "concurrency": self.concurrency,
            "strategy": self.strategy.name,
        }
        watchdog, summary = self.watchdog, self.summary
        self.heartbeat = Heartbeat(
            self.context,
            self.engine,
            identity,
            lambda: watchdog.running() if watchdog is not None else [],
            lambda: (summary.processed, summary.failed),
            self.options.heartbeat_interval or DEFAULT_HEARTBEAT_INTERVAL,
            leases=self.leases,
        )
        return self.heartbeat.start().stop


def _say_started(worker: Worker) -> None:
    assert worker.strategy is not None and worker.notifier is not None
    log.info(
        "worker %s on %s: strategy %s, queues %s, concurrency %d, %s",
        worker.name,
        worker.strategy.dialect.server_description,
        worker.strategy.name,
        ", ".join(worker.queues),
        worker.concurrency,
        worker.notifier.wake_mode,
    )


def _say_stopped(worker: Worker) -> None:
    if not worker._ended or worker.run_state.fatal is not None:
        return
    summary = worker.summary
    log.info(
        "worker %s stopped: %d succeeded, %d failed, %d cancelled",
        worker.name,
        summary.succeeded,
        summary.failed,
        summary.cancelled,
    )

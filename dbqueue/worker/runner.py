"""The worker process: N threads, each with its own connection, claiming and running batches."""

from __future__ import annotations

import logging
import os
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
from ..maintenance import Maintenance, MaintenanceSettings
from ..migrate import check_schema
from ..wakeup import Notifier, WakeSignal
from .executor import BatchExecutor, BatchResult

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


@dataclass
class WorkerSummary:
    succeeded: int = 0
    failed: int = 0
    rounds: int = 0
    reconnects: int = 0
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
        sleep after work. strategy: claim strategy (default: the database's). maintenance: run
        the leader-elected purge/rescue/re-notify routines (settings: ``maintenance_settings``).
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
        maintenance: bool = True,
        maintenance_settings: MaintenanceSettings | None = None,
        install_signal_handlers: bool = True,
        name: str | None = None,
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
        self.run_maintenance = maintenance and not burst
        self.maintenance_settings = maintenance_settings or app.maintenance_settings
        self.install_signal_handlers = install_signal_handlers
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.summary = WorkerSummary()
        self._stop = threading.Event()
        self._signal = WakeSignal()
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
        self._signal.wake()

    def wake(self) -> None:
        """Make idle threads claim now instead of at the end of their poll interval."""
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
            max_overflow=2,
            execution_options={dialects.WRITE_INTENT: True},
        )
        self.app.local_workers.add(self)
        try:
            self._start_up()
            if self.max_runtime is not None:
                self._deadline = time.monotonic() + self.max_runtime
            threads = [
                threading.Thread(target=self._thread_main, args=(i,), name=f"dbqueue-worker-{i}")
                for i in range(self.concurrency)
            ]
            with self._signals():
                for thread in threads:
                    thread.start()
                for thread in threads:
                    while thread.is_alive():
                        thread.join(0.2)
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
                check_schema(conn, self.app.names)
        except sa.exc.DBAPIError as exc:
            raise DatabaseUnavailableError(
                f"cannot connect to {redact(self.app.url)}: {_first_line(exc.orig)} "
                "(check --url / DBQUEUE_URL, that the server is running, and the credentials)"
            ) from None
        self.strategy = strategies.create(self.strategy_name, dialect, self.app.settings)
        self.notifier = self.strategy.notifier(self._engine, self.app.names) or dialect.notifier(
            self._engine, self.app.names.qualified_jobs
        )
        if self.poll_interval is None:
            settings = self.app.settings
            if self.notifier.pushes:
                self.poll_interval = settings.wait_notify_interval or DEFAULT_PUSH_POLL_INTERVAL
            else:
                self.poll_interval = settings.poll_interval or DEFAULT_POLL_INTERVAL
        if not self.burst:
            self.notifier.start(self._signal.wake)
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

    def _shut_down(self) -> None:
        if self.maintenance is not None:
            self.maintenance.stop()
        if self.notifier is not None:
            self.notifier.stop()
        if self.strategy is not None:
            self.strategy.close()
        if self._engine is not None:
            self._engine.dispose()

    def _thread_main(self, index: int) -> None:
        assert self.strategy is not None and self._engine is not None
        executor = BatchExecutor(
            self.app.registry, self.strategy, self.app.backoff, f"{self.name}:{index}"
        )
        conn: Connection | None = None
        failures = 0
        batch = 1
        turn = index
        idle = self.min_poll_interval
        try:
            while not self.stopping and self._budget_left():
                seen = self._signal.generation
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
                    conn = _discard(conn, broken=True)
                    failures += 1
                    self._after_error(exc, failures)
                    continue
                turn += 1
                if claimed:
                    fast = seconds / claimed < FAST_JOB_SECONDS
                    batch = min(self.batch_size, batch * 2) if fast else 1
                    idle = self.min_poll_interval
                    continue
                if self.burst:
                    break
                batch = 1
                woken = self._signal.wait(seen, self._idle_timeout(conn, idle))
                idle = self.min_poll_interval if woken else min(idle * 2, self.poll_interval)
        finally:
            _discard(conn)

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
        with conn.begin():
            result = executor.execute(conn, engine, jobs, lambda: self.stopping)
        self.strategy.release(conn, engine, jobs)
        return result

    # ---- helpers ------------------------------------------------------------------------------
    def _after_error(self, exc: Exception, failures: int) -> None:
        dialect = self.strategy.dialect if self.strategy else None
        if dialect is not None and dialect.is_transient(exc):
            log.info("transaction retried after a transient error: %s", _first_line(exc))
            time.sleep(random.uniform(0.01, 0.1))
            return
        delay = min(MAX_RECONNECT_DELAY, 0.5 * 2 ** (failures - 1)) * random.uniform(0.8, 1.2)
        if isinstance(exc, sa.exc.DBAPIError):
            log.warning("database error (%s); reconnecting in %.1fs", _first_line(exc.orig), delay)
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

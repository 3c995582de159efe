"""A worker's options, checked once: ``Worker(app, **options)`` and ``app.worker(**options)``
build a ``WorkerSettings`` from them, and a worker can be given one directly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dbqueue.base.identifiers import check_queue_name
from dbqueue.base.limits import check_queue_limits
from dbqueue.config import MaintenanceSettings
from dbqueue.errors import ConfigurationError
from dbqueue.worker.heartbeat import DEFAULT_HEARTBEAT_INTERVAL
from dbqueue.worker.leased import MIN_BEATS_PER_LEASE
from dbqueue.worker.process import positive_int, positive_seconds, seconds_or_zero
from dbqueue.worker.watchdog import CANCEL_NOTICE, DEFAULT_TIMEOUT_GRACE

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext

DEFAULT_BATCH_SIZE = 10
#: Idle polling starts this short after a busy spell and doubles up to the poll interval.
DEFAULT_MIN_POLL_INTERVAL = 0.05
#: Longest idle sleep where nothing pushes wake-ups (MySQL, SQLite).
DEFAULT_POLL_INTERVAL = 1.0
#: Longest idle sleep where inserts push a wake-up (PostgreSQL NOTIFY, the lock server): only a
#: lost notification waits this long (the seed's QUEUE_WAIT_NOTIFY_INTERVAL).
DEFAULT_PUSH_POLL_INTERVAL = 30.0


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker runs. None stands for "the App's" (or the database's) choice.

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
    install_signal_handlers: SIGTERM/SIGINT stop the worker gracefully, a second one at once
    (main thread only). shutdown_timeout: seconds a stop (a signal, ``worker.stop()``,
    ``max_runtime``) waits for running jobs before it stops at once, as a second signal does
    (0: no wait; default DBQUEUE_SHUTDOWN_TIMEOUT, else as long as they run).
    name: how the worker is known (default ``host:pid``). lease_seconds: how long a job run
    outside its claim's transaction (``@app.task(transaction=False)``) stays this worker's
    without a heartbeat: the heartbeat moves it on; rescue retries a job whose lease ended
    (default DBQUEUE_LEASE_SECONDS, else 60 s; at least three heartbeats).
    """

    queues: Sequence[str] | None = None
    concurrency: int = 1
    burst: bool = False
    max_jobs: int | None = None
    max_runtime: float | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    poll_interval: float | None = None
    min_poll_interval: float = DEFAULT_MIN_POLL_INTERVAL
    strategy: str | None = None
    lock_server: str | None = None
    maintenance: bool = True
    maintenance_settings: MaintenanceSettings | None = None
    periodic: bool = True
    install_signal_handlers: bool = True
    name: str | None = None
    job_timeout: float | None = None
    timeout_grace: float = DEFAULT_TIMEOUT_GRACE
    cancel_notice: float = CANCEL_NOTICE
    log_jobs: bool | None = None
    queue_limits: Mapping[str, int] | None = None
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    lease_seconds: float | None = None
    shutdown_timeout: float | None = None

    def __post_init__(self) -> None:
        checked = {
            "queues": (
                tuple(check_queue_name(queue) for queue in dict.fromkeys(self.queues))
                if self.queues
                else None
            ),
            "queue_limits": check_queue_limits(self.queue_limits or {}),
            "concurrency": positive_int("concurrency", self.concurrency),
            "batch_size": positive_int("batch_size", self.batch_size),
            "max_jobs": None if self.max_jobs is None else positive_int("max_jobs", self.max_jobs),
            "shutdown_timeout": seconds_or_zero("shutdown_timeout", self.shutdown_timeout),
        }
        for seconds in (
            "max_runtime",
            "poll_interval",
            "min_poll_interval",
            "job_timeout",
            "timeout_grace",
            "cancel_notice",
            "heartbeat_interval",
            "lease_seconds",
        ):
            checked[seconds] = positive_seconds(seconds, getattr(self, seconds))
        for option, value in checked.items():
            object.__setattr__(self, option, value)
        if self.lease_seconds is not None:
            check_lease(self.lease_seconds, self.heartbeat_interval)


def check_lease(lease_seconds: float, heartbeat_interval: float) -> float:
    """A lease outlasts a few heartbeats, so that one late beat never loses it."""
    if lease_seconds < MIN_BEATS_PER_LEASE * heartbeat_interval:
        raise ConfigurationError(
            f"lease_seconds={lease_seconds:g} is shorter than {MIN_BEATS_PER_LEASE} heartbeats "
            f"(heartbeat_interval={heartbeat_interval:g}): a late heartbeat would lose the "
            f"lease of a job that still runs; raise it to at least "
            f"{MIN_BEATS_PER_LEASE * heartbeat_interval:g} s, or beat more often"
        )
    return lease_seconds


def resolve_queues(
    context: RuntimeContext, queues: Sequence[str] | None, limits: Mapping[str, int] | None
) -> tuple[list[str], dict[str, int]]:
    """The queues to consume, and the limits among them: the App's (``app.queue``), then
    the worker's own (``queue_limits`` / ``--queue-limit``), which win."""
    declared = context.registry.queue_limits
    given = dict(limits or {})
    if queues:
        chosen = list(queues)
    else:
        registered = [*context.registry.queues(), *declared, *given]
        chosen = [
            check_queue_name(queue)
            for queue in dict.fromkeys([context.default_queue, *sorted(registered)])
        ]
    stray = [queue for queue in given if queue not in chosen]
    if stray:
        raise ConfigurationError(
            f"queue_limits / --queue-limit name queue(s) this worker does not consume: "
            f"{', '.join(stray)} (it consumes {', '.join(chosen)}): add them to its queues "
            "(--queue), or drop their limits"
        )
    merged = {**declared, **given}
    return chosen, {queue: merged[queue] for queue in chosen if queue in merged}

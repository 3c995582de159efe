"""Prometheus metrics (``pip install 'dbqueue-sql[metrics]'``, prometheus-client).

Two kinds, read by different processes:

* **per process** — jobs enqueued (counted where the INSERT runs), and in a worker the attempts
  it finished by outcome, their handler duration and queue time: ``instrument(app)`` turns
  them on (``serve(app, port)`` / ``dbqueue worker --metrics-port N`` also serve them).
  Counters live in memory; a worker updates them on its finished-jobs thread once the outcome
  has committed, never on the threads that claim and run jobs.
* **per queue** — jobs by status, lag, live workers: read from the database by one process
  (the dashboard's ``/metrics``, or any app mounting ``make_asgi_app(app)`` /
  ``make_wsgi_app(app)``), not by every worker: ``QueueCollector(app)``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from dbqueue.app.monitoring import Monitoring
from dbqueue.base.distribution import install_hint
from dbqueue.errors import ConfigurationError

if TYPE_CHECKING:
    from dbqueue.app.facade import App

#: Seconds, from a no-op handler to a long batch job.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
DURATION_BUCKETS += (2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
LABELS = ("queue", "task")


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(
            f"Prometheus metrics need prometheus-client: {install_hint('metrics')}"
        ) from None
    return prometheus_client


class JobMetrics:
    """The per-process metrics on one prometheus-client registry."""

    def __init__(self, registry: Any) -> None:
        p = _prometheus()

        def counter(name: str, doc: str) -> Any:
            return p.Counter(name, doc, LABELS, registry=registry)

        self.enqueued = counter("dbqueue_jobs_enqueued", "Jobs inserted by this process.")
        self.processed = counter("dbqueue_jobs_processed", "Attempts finished, any outcome.")
        self.succeeded = counter("dbqueue_jobs_succeeded", "Attempts that succeeded.")
        self.failed = counter("dbqueue_jobs_failed", "Attempts that failed (retried or dead).")
        self.retried = counter("dbqueue_jobs_retried", "Failed attempts that will run again.")
        self.dead = counter("dbqueue_jobs_dead", "Failed attempts that left the job dead.")
        self.cancelled = counter("dbqueue_jobs_cancelled", "Attempts stopped by a cancel request.")
        self.duration = p.Histogram(
            "dbqueue_job_duration_seconds",
            "Seconds a handler ran.",
            LABELS,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.queue_time = p.Histogram(
            "dbqueue_job_queue_time_seconds",
            "Seconds from a job's run_at (when it became runnable) to its claim.",
            LABELS,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._by_outcome = {
            "succeeded": (self.succeeded,),
            "failed": (self.failed, self.retried),
            "dead": (self.failed, self.dead),
            "cancelled": (self.cancelled,),
        }

    def on_enqueue(self, jobs: Sequence[Any]) -> Any:
        def after(ids: Sequence[int], error: BaseException | None) -> None:
            if error is None:
                for job in jobs:
                    self.enqueued.labels(job.queue, job.task).inc()

        return after

    def on_finished(self, job: Any, outcome: str, seconds: float) -> None:
        labels = (job.queue, job.task)
        self.processed.labels(*labels).inc()
        for counter in self._by_outcome.get(outcome, ()):
            counter.labels(*labels).inc()
        self.duration.labels(*labels).observe(seconds)
        if job.started_at is not None and job.run_at is not None:
            waited = (job.started_at - job.run_at).total_seconds()
            self.queue_time.labels(*labels).observe(max(0.0, waited))


_LOCK = threading.Lock()
_BY_REGISTRY: dict[int, tuple[Any, JobMetrics]] = {}


def job_metrics(registry: Any = None) -> JobMetrics:
    """The per-process metrics on ``registry`` (default: prometheus-client's global one),
    created once: a name registers once per registry."""
    registry = registry if registry is not None else _prometheus().REGISTRY
    with _LOCK:
        found = _BY_REGISTRY.get(id(registry))
        if found is None or found[0] is not registry:
            found = _BY_REGISTRY[id(registry)] = (registry, JobMetrics(registry))
        return found[1]


def instrument(app: App, registry: Any = None) -> JobMetrics:
    """Count this process's enqueues and, in its workers, finished jobs (idempotent)."""
    metrics = job_metrics(registry)
    instruments = app.context.instruments
    if metrics.on_finished not in instruments.finished:
        instruments.add(enqueue=metrics.on_enqueue, finished=metrics.on_finished)
    return metrics


def serve(app: App, port: int, bind: str = "0.0.0.0", registry: Any = None) -> Any:
    """Instrument ``app`` and serve ``/metrics`` on ``bind:port`` from a daemon thread
    (``dbqueue worker --metrics-port``); returns prometheus-client's server."""
    p = _prometheus()
    instrument(app, registry)
    registry = registry if registry is not None else p.REGISTRY
    try:
        server, _thread = p.start_http_server(port, addr=bind, registry=registry)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve metrics on {bind}:{port}: {exc.strerror or exc}; choose another "
            "--metrics-port (0: any free port)"
        ) from None
    logging.getLogger("dbqueue.metrics").info(
        "Prometheus metrics on http://%s:%d/metrics", bind, server.server_port
    )
    return server


class QueueCollector:
    """Queue depth, lag and live workers, read from the database at scrape time (at most once
    per ``max_age`` seconds, however many scrapers): register it in one process only."""

    def __init__(self, app: App, max_age: float = 5.0) -> None:
        self.app = app
        self.max_age = max_age
        self._lock = threading.Lock()
        self._cached: tuple[float, list[Any]] | None = None

    def describe(self) -> list[Any]:
        return []  # no query when registered

    def collect(self) -> Iterator[Any]:
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] >= self.max_age:
                self._cached = (now, self._read())
            families = self._cached[1]
        yield from families

    def _read(self) -> list[Any]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily("dbqueue_up", "1: the last read of the queue tables worked.")
        jobs = GaugeMetricFamily(
            "dbqueue_queue_jobs", "Jobs by queue and status.", labels=("queue", "status")
        )
        lag = GaugeMetricFamily(
            "dbqueue_queue_lag_seconds",
            "Age of the oldest runnable job not running yet (0: none waits).",
            labels=("queue",),
        )
        workers = GaugeMetricFamily("dbqueue_workers", "Live worker processes.")
        try:
            stats, live = Monitoring(self.app.context).snapshot()  # one read of the registry
        except Exception:  # a scrape must answer: say the database could not be read
            up.add_metric([], 0)
            return [up]
        up.add_metric([], 1)
        for summary in stats:
            for status, n in summary.by_status.items():
                jobs.add_metric([summary.queue, status], n)
            lag.add_metric([summary.queue], summary.oldest_runnable_age or 0.0)
        workers.add_metric([], len(live))
        return [up, jobs, lag, workers]


def queue_registry(app: App) -> Any:
    """A registry holding a QueueCollector of ``app``: what the ready-made apps serve."""
    registry = _prometheus().CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(app))
    return registry


def make_asgi_app(app: App, registry: Any = None) -> Any:
    """An ASGI app serving the queue metrics (``registry``: another registry to serve)."""
    return _prometheus().make_asgi_app(registry or queue_registry(app))


def make_wsgi_app(app: App, registry: Any = None) -> Any:
    """A WSGI app serving the queue metrics (``registry``: another registry to serve)."""
    return _prometheus().make_wsgi_app(registry or queue_registry(app))

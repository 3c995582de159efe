"""``dbqueue.metrics``: Prometheus metrics.

A documented import path, kept: the code lives in ``dbqueue.observability.metrics``."""

from dbqueue.observability.metrics import (
    DURATION_BUCKETS,
    LABELS,
    JobMetrics,
    QueueCollector,
    instrument,
    job_metrics,
    make_asgi_app,
    make_wsgi_app,
    queue_registry,
    serve,
)

__all__ = [
    "DURATION_BUCKETS",
    "LABELS",
    "JobMetrics",
    "job_metrics",
    "instrument",
    "serve",
    "QueueCollector",
    "queue_registry",
    "make_asgi_app",
    "make_wsgi_app",
]

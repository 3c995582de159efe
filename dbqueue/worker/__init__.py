"""The worker runtime: threads, signals, limits, and the per-batch executor."""

from dbqueue.worker.runner import Worker, WorkerSummary
from dbqueue.worker.session import JobSession

__all__ = ["Worker", "WorkerSummary", "JobSession"]

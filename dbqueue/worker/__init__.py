"""The worker runtime: threads, signals, limits, and the per-batch executor."""

from dbqueue.worker.runner import Worker, WorkerSummary
from dbqueue.worker.session import JobSession
from dbqueue.worker.settings import WorkerSettings

__all__ = ["Worker", "WorkerSettings", "WorkerSummary", "JobSession"]

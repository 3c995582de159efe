"""The worker runtime: threads, signals, limits, background services and the per-batch executor.
Public: ``Worker``, ``WorkerSettings``, ``WorkerSummary``, ``JobSession`` (also exported by
``dbqueue``) and ``dbqueue.worker.async_session.AsyncJobSession``; the rest is internal."""

from dbqueue.worker.runner import Worker, WorkerSummary
from dbqueue.worker.session import JobSession
from dbqueue.worker.settings import WorkerSettings

__all__ = ["Worker", "WorkerSettings", "WorkerSummary", "JobSession"]

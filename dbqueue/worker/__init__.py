"""The worker runtime: threads, signals, limits, and the per-batch executor."""

from .runner import Worker, WorkerSummary
from .session import JobSession

__all__ = ["Worker", "WorkerSummary", "JobSession"]

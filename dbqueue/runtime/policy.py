"""What a failed attempt leads to: a retry after the backoff, or death (and a dead-letter job).

One rule for every place that records a failure: the worker's executor (a handler raised, timed
out or was abandoned) and the rescue routine (the job's worker died).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from dbqueue.engine import FailResult, QueueEngine
from dbqueue.job import Job
from dbqueue.tasks.registry import EXCLUSIVE, TaskRegistry
from dbqueue.tasks.retry import BACKOFF, Backoff, Requested, retry_delay


@dataclass(frozen=True)
class RetryPolicy:
    """The registry's per-task backoff and dead handlers, else the App's default backoff."""

    registry: TaskRegistry
    default_backoff: Backoff

    def retry_in(self, job: Job, requested: Requested = BACKOFF) -> float | None:
        """Seconds until the next attempt, or None: attempts are exhausted (or the handler
        discarded the job, ``requested`` None), the job is dead. ``requested`` seconds (the
        handler raised Retry) replace the backoff."""
        backoff = self.registry.backoff_for(job) or self.default_backoff
        return retry_delay(job.attempt, job.max_attempts, backoff, requested)

    def fail(
        self,
        conn: Connection,
        engine: QueueEngine,
        job: Job,
        message: str,
        *,
        requested: Requested = BACKOFF,
        **where: Any,
    ) -> tuple[FailResult, float | None]:
        """Record the failed attempt; ``where`` narrows the UPDATE (expected status, worker id,
        attempt increment …, see ``QueueEngine.fail``). Returns the result and the retry
        delay (None: dead)."""
        delay = self.retry_in(job, requested)
        failed = engine.fail(
            conn,
            job,
            message,
            retry_in=delay,
            dead_letter=self.registry.has_dead_handler(job),
            exclusive_key=job.key_seq is not None and self.registry.key_mode_for(job) == EXCLUSIVE,
            **where,
        )
        return failed, delay

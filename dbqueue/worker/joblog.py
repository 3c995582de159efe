"""The per-job log line (``Worker(log_jobs=True)``, ``dbqueue worker --log-jobs``): one INFO
record per finished job on the ``dbqueue.jobs`` logger, with the job's fields as extra fields.

Off by default, and then nothing here runs: the executor times its handlers only when it has a
JobLog. On, a worker thread only notes each run (two clock reads and an append) and, once the
batch's transaction has committed, hands the batch over; one writer thread per worker makes
and writes the records while the worker threads wait on the database. A record costs about a
third of a no-op job's own Python work, so it stays off the threads' path from claim to claim.
An attempt that rolled back is never logged (it runs again, and is logged then).
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dbqueue.base.service import Service
from dbqueue.engine.instruments import FinishedObserver
from dbqueue.job import Job

if TYPE_CHECKING:
    from dbqueue.tasks.retry import RetryPolicy

log = logging.getLogger("dbqueue.jobs")

RunOne = Callable[[Any, Job], Any]
#: (job, its Outcome — ok, and the retry a failure asked for —, seconds it ran)
Finished = tuple[Job, Any, float]
MESSAGE = "job %s (%s) %s in %.1f ms (queue %s, attempt %s)"
#: Batches waiting for the writer before a worker thread waits for it (memory stays bounded
#: when records are made more slowly than jobs finish).
BACKLOG = 1000


class JobLogWriter(Service):
    """The worker's writer thread: makes and writes the records of committed batches, and
    hands each finished job to the observers (metrics: ``dbqueue.engine.instruments``).
    Stopping writes what is queued first."""

    name = "dbqueue-job-log"
    stop_timeout = None

    def __init__(
        self,
        policy: RetryPolicy,
        observers: Sequence[FinishedObserver] = (),
        log_jobs: bool = True,
    ) -> None:
        super().__init__()
        self._policy = policy
        self._observers = tuple(observers)
        self._log_jobs = log_jobs
        self._batches: queue.Queue[list[Finished] | None] = queue.Queue(BACKLOG)

    def put(self, batch: list[Finished]) -> None:
        self._batches.put(batch)

    def interrupt(self) -> None:
        """The end marker, behind the batches queued (a dead thread would never take it)."""
        if self.is_alive():
            self._batches.put(None)

    def run(self) -> None:
        while (batch := self._batches.get()) is not None:
            logging_on = self._log_jobs and log.isEnabledFor(logging.INFO)
            for job, result, seconds in batch:
                outcome = self._outcome(job, result)
                if logging_on:
                    self._emit(job, outcome, seconds)
                for observer in self._observers:
                    try:
                        observer(job, outcome, seconds)
                    except Exception:  # an observer's bug must not stop the log or the others
                        log.debug("finished-job observer %r failed", observer, exc_info=True)
            self.iterations.add()

    def _outcome(self, job: Job, result: Any) -> str:
        if result.ok:
            return "succeeded"
        # a job stopped by a cancel request knows it was asked
        return "cancelled" if job.cancel_requested() else self._failure(job, result.requested)

    def _emit(self, job: Job, outcome: str, seconds: float) -> None:
        duration_ms = round(seconds * 1000, 3)
        fields = {
            "task": job.task,
            "job_id": job.id,
            "queue": job.queue,
            "attempt": job.attempt,
            "outcome": outcome,
            "duration_ms": duration_ms,
        }
        args = (job.id, job.task, outcome, duration_ms, job.queue, job.attempt)
        # log.info() without its caller lookup (a walk up the stack per record): the caller is
        # always this method.
        log.handle(
            log.makeRecord(
                log.name, logging.INFO, __file__, 0, MESSAGE, args, None, "_emit", fields
            )
        )

    def _failure(self, job: Job, requested: Any) -> str:
        """The rule the failure was recorded by: no retry left (or Discard) means dead."""
        return "dead" if self._policy.retry_in(job, requested) is None else "failed"


class JobLog:
    """One worker thread's finished jobs, from their run until their transaction commits."""

    def __init__(self, writer: JobLogWriter) -> None:
        self._writer = writer
        self._pending: list[Finished] = []

    def timed(self, run_one: RunOne) -> RunOne:
        """``run_one(session, job)`` that also notes the job, its result and its duration."""
        clock = time.perf_counter

        def run(session: Any, job: Job) -> Any:
            started = clock()
            outcome = run_one(session, job)
            self._pending.append((job, outcome, clock() - started))
            return outcome

        return run

    def timed_group(self, run_group: Callable[[Any, list[Job]], Any]) -> Any:
        """``run_group(session, jobs)`` (a batch handler's call) noting each of its jobs, with
        the call's duration."""
        clock = time.perf_counter

        def run(session: Any, jobs: list[Job]) -> Any:
            started = clock()
            outcomes, undone = run_group(session, jobs)
            seconds = clock() - started
            ran = zip(jobs, outcomes, strict=True)
            self._pending += [(job, o, seconds) for job, o in ran if not o.given_back]
            return outcomes, undone

        return run

    def drop(self) -> None:
        """The jobs noted so far did not commit (a new batch starts, or the claim was lost)."""
        self._pending = []

    def committed(self) -> None:
        """The jobs noted so far have committed: hand them to the writer."""
        if self._pending:
            batch, self._pending = self._pending, []
            self._writer.put(batch)

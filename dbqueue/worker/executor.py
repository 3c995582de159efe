"""Runs the handlers of one claimed batch inside its transaction and writes their outcomes."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from ..engine import QueueEngine
from ..errors import DbqueueError
from ..job import Job, MalformedPayload
from ..retry import Backoff, retry_delay
from ..strategies import ClaimStrategy
from ..tasks import TaskRegistry
from .session import JobSession

log = logging.getLogger("dbqueue.worker")


@dataclass
class BatchResult:
    succeeded: int = 0
    failed: int = 0
    skipped: int = 0


@dataclass(frozen=True)
class Outcome:
    ok: bool
    message: str | None


def describe_failure(exc: BaseException) -> str:
    """What the job's message column records: the exception, then where it came from."""
    head = f"{type(exc).__name__}: {exc}".rstrip(": ")
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=20))
    return f"{head}\n{trace}"


class BatchExecutor:
    def __init__(
        self,
        registry: TaskRegistry,
        strategy: ClaimStrategy,
        default_backoff: Backoff,
        worker_id: str,
    ) -> None:
        self.registry = registry
        self.strategy = strategy
        self.default_backoff = default_backoff
        self.worker_id = worker_id

    def execute(
        self,
        conn: Connection,
        engine: QueueEngine,
        jobs: list[Job],
        should_stop: Callable[[], bool],
    ) -> BatchResult:
        """Run each job in turn (each failure rolls back only its own savepoint), then mark the
        successes in one UPDATE. The caller commits the transaction."""
        result = BatchResult()
        done: list[tuple[Job, str | None]] = []
        unstarted: list[Job] = []
        for job in jobs:
            if should_stop():
                unstarted.append(job)  # never started: given back untouched
                continue
            outcome = self.run_one(conn, job)
            if outcome.ok:
                done.append((job, outcome.message))
                result.succeeded += 1
            else:
                self.record_failure(conn, engine, job, outcome.message or "failed")
                result.failed += 1
        result.skipped = len(unstarted)
        if unstarted and not self.strategy.claims_in_transaction:
            engine.release_claims(conn, unstarted)  # committed as running: undo that
        changed = engine.complete(
            conn,
            done,
            attempt_increment=self.strategy.attempt_increment,
            expected_status=self.strategy.claimed_status,
            worker_id=self.worker_id,
        )
        if changed != len(done):
            log.warning(
                "marked %d of %d finished jobs succeeded: the others changed state while running",
                changed,
                len(done),
            )
        return result

    def run_one(self, conn: Connection, job: Job) -> Outcome:
        try:
            handler = self.registry.handler_for(job)
        except DbqueueError as exc:
            return Outcome(False, str(exc))
        if isinstance(job.payload, MalformedPayload):
            return Outcome(
                False,
                f"{job.payload.error}; the row was probably written by hand: fix its payload "
                "column and requeue it",
            )
        session = JobSession(conn)
        try:
            value = handler(job, session)
            session.keep()
        except Exception as exc:
            session.discard()
            log.debug("job %s (%s) raised", job.id, job.task, exc_info=True)
            return Outcome(False, describe_failure(exc))
        return Outcome(True, None if value is None else str(value))

    def record_failure(self, conn: Connection, engine: QueueEngine, job: Job, message: str) -> None:
        definition = self.registry.get(job.task)
        backoff = (definition.backoff if definition else None) or self.default_backoff
        delay = retry_delay(job.attempt, job.max_attempts, backoff)
        dead_letter_id = engine.fail(
            conn,
            job,
            message,
            retry_in=delay,
            attempt_increment=self.strategy.attempt_increment,
            expected_status=self.strategy.claimed_status,
            worker_id=self.worker_id,
            dead_letter=self.registry.has_dead_handler(job),
        )
        first_line = message.splitlines()[0] if message else ""
        if delay is None:
            log.warning(
                "job %s (%s) is dead after attempt %s/%s: %s%s",
                job.id,
                job.task,
                job.attempt,
                job.max_attempts,
                first_line,
                f"; dead-letter job {dead_letter_id} will run its dead handler"
                if dead_letter_id
                else "",
            )
        else:
            log.warning(
                "job %s (%s) failed attempt %s/%s, retry in %.1fs: %s",
                job.id,
                job.task,
                job.attempt,
                job.max_attempts,
                delay,
                first_line,
            )

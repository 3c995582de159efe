"""Eager mode's runner: the worker's executor, run in the enqueuing thread once the jobs commit.

Each job is claimed by id with the queue's claim strategy — so a worker running beside it cannot
take it too, and one that already has it keeps it — and run by the worker's ``BatchExecutor``:
the same handler call, savepoint, outcome UPDATE, retry policy and dead-letter job as in a
worker. A failed attempt is recorded, then the job is claimed again at once (the backoff is not
waited for), until it succeeds or dies; a dead-letter job runs next, and so do the jobs a
handler enqueues (after the job that enqueued them has committed). Nothing else of a worker
applies: no timeouts, no queue limits, no concurrency, no job log.

The App's eager mode (``dbqueue.app.eager``) calls it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any

from sqlalchemy.engine import Connection, Engine

from dbqueue import dialects
from dbqueue.base.results import running_handlers
from dbqueue.engine import QueueEngine
from dbqueue.errors import UnknownTaskError
from dbqueue.job import Job, Status
from dbqueue.runtime.context import RuntimeContext
from dbqueue.strategies import ClaimStrategy
from dbqueue.worker.executor import BatchExecutor
from dbqueue.worker.loop import claim_and_run

log = logging.getLogger("dbqueue.eager")


class EagerRunner:
    """Runs committed jobs by id, each to its end, in the calling thread."""

    def __init__(self, context: RuntimeContext) -> None:
        self.context = context
        self._local = threading.local()
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._dialect: dialects.Dialect | None = None

    def run(self, ids: Iterable[int]) -> list[dict[str, Any]]:
        """Run these committed jobs now; returns one dict per job that died or that this
        process cannot run (``id``, ``task``, ``status``, ``message``). Called again while
        it runs (a handler enqueued a job), it queues the jobs after the current one."""
        pending: deque[int] | None = getattr(self._local, "pending", None)
        if pending is not None:
            pending.extend(ids)
            return []
        self._local.pending = pending = deque(ids)
        try:
            with running_handlers():  # app.call from a handler is refused: it would wait on it
                return self._drain(pending)
        finally:
            self._local.pending = None

    def _drain(self, pending: deque[int]) -> list[dict[str, Any]]:
        engine, dialect = self._connect()
        strategy = self.context.open_strategy(dialect)
        worker_id = f"{socket.gethostname()}:{os.getpid()}:eager:{threading.get_ident()}"
        executor = BatchExecutor(self.context, strategy, worker_id)
        executor.on_dead_letter = pending.append  # a dead-letter job runs next
        failures: list[dict[str, Any]] = []
        try:
            with engine.connect() as conn:
                queue_engine = self.context.queue_engine(conn)
                while pending:
                    failure = self._run_to_end(conn, queue_engine, executor, strategy, pending[0])
                    pending.popleft()
                    if failure is not None:
                        failures.append(failure)
        finally:
            strategy.close()
        return failures

    def _run_to_end(
        self,
        conn: Connection,
        engine: QueueEngine,
        executor: BatchExecutor,
        strategy: ClaimStrategy,
        job_id: int,
    ) -> dict[str, Any] | None:
        """Claim and run the job again and again until it no longer waits: succeeded, dead, or
        taken by a worker. Returns its row if it died or cannot run here."""
        with conn.begin():
            row = engine.queries.get(conn, job_id)
        if row is None or row["status"] != Status.AVAILABLE:
            return None  # rolled back with a savepoint, cancelled, or a worker has it
        reason = self._cannot_run(conn, row)
        if reason is not None:
            log.warning(
                "eager mode: job %s (%s) is left for a worker: %s", job_id, row["task"], reason
            )
            return {**row, "message": reason}

        def claim() -> list[Job]:
            return strategy.claim_ids(conn, engine.claims, [job_id], executor.worker_id)

        # One attempt per claim; the claim after the last finds the job finished.
        for _ in range(max(0, row["max_attempts"] - row["attempt"]) + 1):
            if claim_and_run(executor, conn, engine, claim, lambda: False) is None:
                break
        with conn.begin():
            row = engine.queries.get(conn, job_id)
        if row is not None and row["status"] == Status.AVAILABLE:
            # A worker holds it (its claim is not committed yet), or its attempts ran out
            # uncounted (a handler rescheduled it itself): not this thread's any more.
            log.info("eager mode: job %s (%s) is left for a worker", job_id, row["task"])
        return row if row is not None and row["status"] == Status.DEAD else None

    def _cannot_run(self, conn: Connection, row: dict[str, Any]) -> str | None:
        """Why this process cannot run the job (no handler registered here), or None: such a
        job is left for a worker that can, as it may belong to another service."""
        job = Job(**row)
        try:
            self.context.registry.resolve(job)
        except UnknownTaskError as exc:
            if job.subscription_id is not None and not job.dead:
                with conn.begin():
                    subscription = self.context.subscriptions.get(conn, job.subscription_id)
                if subscription is not None and subscription.url:
                    return None  # a webhook delivery: the executor calls the url
            return str(exc)
        return None

    def _connect(self) -> tuple[Engine, dialects.Dialect]:
        """The App's engine — or, if the application gave its own, one set up as a worker's
        (SQLite's BEGIN IMMEDIATE, savepoints) — marked for claims, checked once like a
        worker's at start-up."""
        with self._lock:
            if self._engine is None or self._dialect is None:
                engine = self.context.engine
                if not dialects.is_configured(engine):
                    engine = self.context.create_engine(pool_size=1)
                engine = engine.execution_options(**{dialects.WRITE_INTENT: True})
                self._dialect = self.context.check_database(engine)
                self._engine = engine
            return self._engine, self._dialect

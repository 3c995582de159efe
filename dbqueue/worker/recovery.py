"""When a handler stays blocked past its timeout (or a cancel request): end its thread's database
connection (its transaction rolls back, its claim is freed), record the timed-out attempt (or
the cancelled job), replace the thread."""

from __future__ import annotations

import logging
import queue as queue_module
import time
from typing import TYPE_CHECKING

from sqlalchemy.engine import Engine

from dbqueue.job import Job
from dbqueue.strategies.base import Fence
from dbqueue.worker.executor import BatchExecutor
from dbqueue.worker.handlers import cancel_message, timeout_message
from dbqueue.worker.process import first_line as _first_line
from dbqueue.worker.state import RunState
from dbqueue.worker.watchdog import CANCEL, Slot

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext
    from dbqueue.strategies import ClaimStrategy

log = logging.getLogger("dbqueue.worker")


class AbandonedThreads:
    """What the watchdog's ``on_stuck`` does for a worker: its threads given up on are
    recovered here, and handed to the supervisor (``given_up``) to be replaced."""

    def __init__(
        self,
        context: RuntimeContext,
        worker_name: str,
        timeout_grace: float,
        engine: Engine,
        strategy: ClaimStrategy,
        run_state: RunState,
    ) -> None:
        self.context = context
        self.worker_name = worker_name
        self.timeout_grace = timeout_grace
        self.engine = engine
        self.strategy = strategy
        self.run_state = run_state
        self._given_up: queue_module.SimpleQueue[Slot] = queue_module.SimpleQueue()

    def given_up(self) -> list[Slot]:
        """The slots recovered since the last call: their threads need a replacement."""
        found = []
        while not self._given_up.empty():
            found.append(self._given_up.get())
        return found

    def on_stuck(self, slot: Slot) -> None:
        """A handler stayed blocked past its timeout and the grace period (watchdog thread).

        Its thread is already marked abandoned, so it will never write again. End its database
        connection, so that its transaction rolls back and its claim (row lock, advisory lock,
        SQLite's write lock) is released; record the timed-out attempt in a transaction of our
        own; ask the supervisor for a replacement thread.
        """
        job = slot.job
        assert job is not None
        log.error(
            "job %s (%s) is still running %.1fs after %s, blocked where %s cannot reach it "
            "(C code: a sleep, a socket read, a lock): abandoning thread %d, ending its database "
            "connection, starting a replacement",
            job.id,
            job.task,
            self.timeout_grace,
            "its cancel request" if slot.reason == CANCEL else f"its {slot.timeout:.1f}s timeout",
            "JobCancelledError" if slot.reason == CANCEL else "JobTimeoutError",
            slot.index,
        )
        self.run_state.count_abandoned_thread()
        try:
            self._end_connection(slot)
            self._record_abandoned(slot, job)
        finally:
            self._given_up.put(slot)
            self.run_state.signal.wake()

    def _end_connection(self, slot: Slot) -> None:
        fairy = getattr(slot.connection, "connection", None) if slot.connection else None
        dbapi_connection = getattr(fairy, "dbapi_connection", None)
        if dbapi_connection is None:
            return
        try:
            ended = self.strategy.dialect.end_connection(self.engine, dbapi_connection)
        except Exception as exc:
            log.warning("could not end the stuck thread's connection: %s", _first_line(exc))
            return
        if not ended:
            log.warning(
                "%s cannot end another connection: the stuck job's claim is held until its "
                "handler returns",
                self.strategy.dialect.server_description,
            )

    def _record_abandoned(self, slot: Slot, job: Job) -> None:
        executor = BatchExecutor(self.context, self.strategy, f"{self.worker_name}:watchdog")
        cancelled = slot.reason == CANCEL
        size = len(slot.group or [job])
        what = cancel_message(job) if cancelled else timeout_message(job, slot.timeout, size)
        message = (
            f"{what}; it did not stop within {self.timeout_grace!r} s more (blocked in C code), "
            "so its thread was abandoned and its database connection ended: its database "
            "writes were rolled back, but work outside the database may still happen if the "
            "blocked code resumes"
        )
        if not cancelled:
            message = f"JobTimeoutError: {message}"
        record = executor.record_cancelled if cancelled else executor.record_failure
        worker_id = f"{self.worker_name}:{slot.index}"
        # The handler's call: one job, or a batch handler's jobs (of which a cancel request
        # ends only those it named; the others go back with the rest of the claim).
        group = [
            member for member in slot.group or [job] if not cancelled or member.cancel_requested()
        ]
        others = [other for other in slot.batch if all(other is not m for m in group)]
        changed = 0
        for attempt in range(5):
            try:
                with self.engine.connect() as conn:
                    engine = self.context.queue_engine(conn)
                    # The abandoned thread's claim, recorded by the watchdog's executor.
                    claimed = Fence.leased(worker_id) if slot.leased else None
                    fence = (claimed or self.strategy.fence(worker_id)).recorded_by(
                        executor.worker_id
                    )
                    with conn.begin():
                        changed = sum(
                            record(conn, engine, member, message, fence) for member in group
                        )
                        if slot.leased or not self.strategy.claims_in_transaction:
                            engine.claims.release_claims(conn, others, fence)
                    self.strategy.release_abandoned(engine.claims, slot.batch, slot.thread_id)
                break
            except Exception as exc:
                if attempt == 4:
                    raise
                log.warning("recording the timed-out job failed (%s); retrying", _first_line(exc))
                time.sleep(0.5 * (attempt + 1))
        if not changed:  # the thread recorded it itself before it was given up on: counted there
            return
        if cancelled:
            self.run_state.count_recorded(cancelled=changed)
        else:
            self.run_state.count_recorded(failed=changed)

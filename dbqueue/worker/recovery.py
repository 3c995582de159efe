"""When a handler stays blocked past its timeout (or a cancel request): end its thread's database
connection (its transaction rolls back, its claim is freed), record the timed-out attempt (or
the cancelled job), replace the thread."""

from __future__ import annotations

import logging
import queue as queue_module
import threading
import time
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection, Engine

from dbqueue.job import Job
from dbqueue.strategies.base import Fence
from dbqueue.worker.executor import BatchExecutor
from dbqueue.worker.handlers import cancel_message, timeout_message
from dbqueue.worker.process import first_line as _first_line
from dbqueue.worker.state import RunState
from dbqueue.worker.watchdog import CANCEL, Slot, Watchdog

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext
    from dbqueue.strategies import ClaimStrategy

log = logging.getLogger("dbqueue.worker")

#: How long a stop at once waits for the abandoned threads' connections to be ended (each from
#: a connection of its own) before it goes on: the process's exit ends whatever is left.
END_CONNECTIONS_WAIT = 10.0


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
        #: The threads given up on while a handler ran in them.
        self._thread_ids: set[int] = set()

    def given_up(self) -> list[Slot]:
        """The slots recovered since the last call: their threads need a replacement."""
        found = []
        while not self._given_up.empty():
            found.append(self._given_up.get())
        return found

    def still_running(self) -> int:
        """How many threads given up on while a handler ran in them are still running it
        (blocked in C): Python cannot end them."""
        ids = self._thread_ids
        return sum(1 for thread in threading.enumerate() if thread.ident in ids)

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
        self._thread_ids.add(slot.thread_id)
        try:
            self._end_connection(slot)
            self._record_abandoned(slot, job)
        finally:
            self._given_up.put(slot)
            self.run_state.signal.wake()

    def stop_at_once(
        self, slots: list[Slot], running: list[Slot], watchdog: Watchdog, why: str
    ) -> None:
        """The worker stops without waiting for its running jobs (a second signal, or the
        shutdown timeout): every thread was given up (``Watchdog.abandon_all``; ``running``:
        those in a handler); end their connections, so that what their jobs wrote rolls back
        and their claims are freed. Nothing is recorded: the jobs come back by the rules for a
        worker that died.

        Plain handlers on an async worker's slots run in a greenlet: at the interpreter's exit
        a daemon thread that wakes there is ended in a way greenlet does not survive (the
        process crashes). Those are given ``timeout_grace`` to unwind (``Abandoned`` was
        raised in them: Python code stops at once); code blocked in C may outlast it."""
        self._say_abandoned(running, why)
        for slot in running:
            self.run_state.count_abandoned_thread()
            self._thread_ids.add(slot.thread_id)
        enders = [
            threading.Thread(
                target=self._end_connection, args=(slot,), name="dbqueue-stop-now", daemon=True
            )
            for slot in slots
            if slot.connection is not None
        ]
        for ender in enders:
            ender.start()
        deadline = time.monotonic() + END_CONNECTIONS_WAIT
        for ender in enders:
            ender.join(max(0.0, deadline - time.monotonic()))
        on_slots = [slot for slot in running if slot.interrupt is not None]
        if on_slots and not watchdog.wait_unarmed(on_slots, self.timeout_grace):
            blocked = sum(1 for slot in on_slots if slot.armed)
            log.warning(
                "%d handler(s) still blocked %.1fs after the stop: the process's exit ends them",
                blocked,
                self.timeout_grace,
            )

    def _say_abandoned(self, running: list[Slot], why: str) -> None:
        """One line: which jobs were abandoned, and how each comes back."""
        if not running:
            log.info("stopping at once (%s): no job was running", why)
            return
        committed = [s for s in running if s.leased or not self.strategy.claims_in_transaction]
        rolled = [slot for slot in running if slot not in committed]
        fates = []
        if rolled:
            fates.append(
                f"job(s) {_ids(rolled)}: their claims roll back with their writes, so they are "
                "available again at once"
            )
        if committed:
            fates.append(
                f"job(s) {_ids(committed)}: their uncommitted writes roll back; they stay "
                "'running' until rescue (maintenance) finds their worker gone (its locks free, "
                "or their leases ended) and retries them"
            )
        log.warning("stopping at once (%s): abandoning %s", why, "; ".join(fates))

    def _end_connection(self, slot: Slot) -> None:
        conn = slot.connection
        if conn is None or _closed(conn):  # its thread closed it already: nothing to end
            return
        try:
            dbapi_connection = getattr(conn.connection, "dbapi_connection", None)
        except Exception:  # closed meanwhile
            return
        if dbapi_connection is None:
            return
        try:
            ended = self.strategy.dialect.end_connection(self.engine, dbapi_connection)
        except Exception as exc:
            if not _closed(conn):
                log.warning("could not end the stuck thread's connection: %s", _first_line(exc))
            return
        if not ended and not _closed(conn):
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


def _closed(conn: Connection) -> bool:
    """The thread that held the connection has closed it (or dropped it after an error)."""
    return bool(conn.closed or conn.invalidated)


def _ids(slots: list[Slot]) -> str:
    """The ids of the jobs whose handler calls the slots were running."""
    jobs = [job for slot in slots for job in slot.group or ([slot.job] if slot.job else [])]
    return ", ".join(str(job.id) for job in jobs)

"""Per-task timeouts and cancellation: one watchdog thread per Worker, bookkeeping in memory only.

Python cannot kill a thread. When a handler runs past its timeout the watchdog first raises
``JobTimeoutError`` inside the handler's thread (``PyThreadState_SetAsyncExc``): pure-Python code
stops at its next bytecode, the job's savepoint rolls back and the attempt is recorded as failed
in the batch transaction, like any other exception. Code blocked in C (``time.sleep``, a socket
read, a lock) never sees that exception. If the handler is still there after a grace period, the
watchdog gives the thread up: it marks it abandoned (an abandoned thread never writes again), and
the Worker ends the thread's database connection from outside, records the timed-out attempt in
a transaction of its own and starts a replacement thread, so concurrency stays whole.

A cancel request for a running job is found by the worker's cancel poller (``CancelPoller``
below: every ``POLL_INTERVAL`` seconds it asks the watchdog, in memory, which jobs belong to
batches whose current handler has run at least that long, and only then reads the requests of
those ids, one indexed query that never waits for a lock; short jobs never cost a query). It is
enforced the same way as a timeout: ``job.cancel_requested()`` turns true at once, and a handler
that has not stopped by itself ``cancel_notice`` seconds later (default ``CANCEL_NOTICE``) gets
``JobCancelledError`` raised in its thread, then is abandoned after the grace period like a
timed-out one.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Engine

from dbqueue.base.service import Service
from dbqueue.engine.cancels import RequestStore
from dbqueue.errors import JobCancelledError, JobTimeoutError
from dbqueue.job import Job
from dbqueue.worker.process import first_line

log = logging.getLogger("dbqueue.worker")

#: How long a handler may stay blocked after JobTimeoutError was raised in its thread before the
#: thread is abandoned and its database connection ended.
DEFAULT_TIMEOUT_GRACE = 5.0
#: The watchdog sleeps at most this long between looks (deadlines normally wake it earlier).
_LONGEST_NAP = 1.0
#: How long a handler told of a cancel request (``job.cancel_requested()``) may take to stop by
#: itself before JobCancelledError is raised in its thread (``Worker(cancel_notice=…)``).
CANCEL_NOTICE = 1.0
#: Why a slot's deadline fired: its timeout, or a cancel request.
TIMEOUT, CANCEL = "timeout", "cancel"


class HandlerTimeout(JobTimeoutError):
    """Raised inside a handler's thread by the watchdog.

    An asynchronous exception can only be a class, so this one carries no message; the executor
    replaces it with a JobTimeoutError that names the job and its timeout.
    """


class HandlerCancelled(JobCancelledError):
    """Raised inside a handler's thread by the watchdog when a cancel request was not heeded
    (a class, like HandlerTimeout); the executor records the job as cancelled."""


class Abandoned(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """Unwinds a worker thread the watchdog gave up on, without writing anything.

    A BaseException so that no ``except Exception`` on the way out can swallow it.
    """


@dataclass(eq=False)
class Slot:
    """What one worker thread is running, as the watchdog sees it."""

    thread_id: int
    index: int
    #: The thread's connection and the batch it runs (set per batch, only when timeouts apply).
    connection: Any = None
    batch: list[Job] = field(default_factory=list)
    #: The batch runs outside its claim's transaction, under a lease (``Fence.leased``).
    leased: bool = False
    job: Job | None = None
    #: The jobs of the handler call that runs: [job], or a batch handler's jobs.
    group: list[Job] = field(default_factory=list)
    timeout: float = 0.0
    deadline: float = math.inf
    #: JobTimeoutError (or JobCancelledError, see ``reason``) was raised in the thread for the
    #: current job.
    fired: bool = False
    #: The watchdog gave the thread up: it must never write to the database again.
    abandoned: bool = False
    #: A handler runs (between arm and disarm), since ``since`` (monotonic seconds).
    armed: bool = False
    since: float = 0.0
    #: What the deadline stands for: TIMEOUT, or CANCEL once a cancel request reached the job.
    reason: str = TIMEOUT
    #: Cancel requests found for jobs of the batch that have not started: id → when asked.
    requests: dict[int, dt.datetime] = field(default_factory=dict)
    #: An async slot's: stops an async handler (cancels its task) and returns True, or returns
    #: False when a plain handler runs (on ``thread_id``, where the exception is raised).
    interrupt: Callable[[type[BaseException]], bool] | None = None


def _raise_in_thread(thread_id: int, exc_type: type[BaseException] | None) -> None:
    """Raise ``exc_type`` in the thread at its next bytecode; None cancels a pending one."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type) if exc_type else ctypes.c_void_p()
    )


class Watchdog(Service):
    """Watches the armed slots; ``on_stuck(slot)`` runs (in a thread of its own) for a handler
    that outlived its timeout (or the notice of a cancel request) by ``grace`` seconds."""

    name = "dbqueue-watchdog"

    def __init__(
        self, grace: float, on_stuck: Callable[[Slot], None], cancel_notice: float = CANCEL_NOTICE
    ) -> None:
        super().__init__()
        self.grace = grace
        self.on_stuck = on_stuck
        self.cancel_notice = cancel_notice
        self._slots: list[Slot] = []
        #: Taken directly by arm() and disarm(), twice per job: the Condition's own ``with``
        #: adds two Python calls each time.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._wake_at = math.inf

    # ---- lifecycle ----------------------------------------------------------------------------
    def interrupt(self) -> None:
        """The loop waits on the slots' condition: stopping is checked under it."""
        with self._cond:
            self._cond.notify()

    def slot(self, index: int) -> Slot:
        """A slot for the calling worker thread."""
        slot = Slot(thread_id=threading.get_ident(), index=index)
        with self._cond:
            self._slots.append(slot)
        return slot

    def forget(self, slot: Slot) -> None:
        with self._cond:
            if slot in self._slots:
                self._slots.remove(slot)

    # ---- called by the handler's thread (in memory, no database round trip) -------------------
    def arm(
        self, slot: Slot, job: Job, timeout: float | None, group: list[Job] | None = None
    ) -> bool:
        """The handler of ``job`` starts (``timeout``: None for none); ``group``: the jobs of a
        batch handler's call (``job`` is the first). False: a cancel request reached one of
        them before it started (its ``cancel_requested()`` is true), and nothing may run."""
        now = time.monotonic()
        deadline = math.inf if timeout is None else now + timeout
        group = group or [job]
        with self._lock:
            slot.job, slot.timeout, slot.deadline, slot.fired = job, timeout or 0.0, deadline, False
            slot.reason, slot.since, slot.group = TIMEOUT, now, group
            requested = [j for j in group if j.id in slot.requests] if slot.requests else []
            for member in requested:
                member.cancel_requested_at = slot.requests.pop(member.id)
            if requested:
                slot.deadline = math.inf
                return False
            slot.armed = True
            if deadline < self._wake_at:
                self._cond.notify()
        return True

    def disarm(self, slot: Slot) -> bool:
        """The handler is done (or unwound): returns whether its timeout fired.

        Idempotent. A JobTimeoutError raised but not yet delivered is cancelled here, so it can
        never hit the worker's own code after the handler.
        """
        with self._lock:
            slot.armed = False
            if slot.abandoned:  # a stop at once may wait for it: see wait_unarmed()
                self._cond.notify_all()
            if slot.deadline != math.inf or slot.fired:
                if slot.fired:
                    _raise_in_thread(slot.thread_id, None)
                slot.deadline = math.inf
            return slot.fired

    # ---- called when the worker stops at once -------------------------------------------------
    def abandon_all(self) -> tuple[list[Slot], list[Slot]]:
        """Give up every thread's slot, as on a stuck handler: from now on none of them writes
        to the database. A running handler gets ``Abandoned`` raised in it (Python code stops
        at once; code blocked in C, when it returns). Returns every slot (their connections are
        still to be ended), and those whose handler was running."""
        with self._cond:
            slots, self._slots = self._slots, []
            running = [slot for slot in slots if slot.armed and slot.job is not None]
            for slot in slots:
                slot.abandoned = True
                slot.deadline = math.inf
                if slot.armed and not slot.fired:  # disarm() cancels it if not delivered yet
                    slot.fired = True
                    if slot.interrupt is None or not slot.interrupt(Abandoned):
                        _raise_in_thread(slot.thread_id, Abandoned)
        return slots, running

    def wait_unarmed(self, slots: list[Slot], timeout: float) -> bool:
        """Wait until none of ``slots`` runs a handler any more, for at most ``timeout``
        seconds; False: some still do (blocked in C)."""
        with self._cond:
            return self._cond.wait_for(lambda: not any(slot.armed for slot in slots), timeout)

    # ---- called by the heartbeat ----------------------------------------------------------------
    def running(self) -> list[tuple[Job, float]]:
        """The jobs whose handlers run now (every job of a batch handler's call), with how
        many seconds each has run."""
        with self._cond:
            now = time.monotonic()
            return [
                (job, now - slot.since)
                for slot in self._slots
                if slot.armed and slot.job is not None and not slot.abandoned
                for job in (slot.group or [slot.job])
            ]

    # ---- called by the cancel poller ----------------------------------------------------------
    def running_longer_than(self, seconds: float) -> list[int]:
        """Ids of the jobs whose cancel requests are worth a query: those of every batch whose
        current handler has run at least ``seconds`` (the job itself, unless a request already
        reached it, and the batch's others, which may be next)."""
        wanted: list[int] = []
        with self._cond:
            started_before = time.monotonic() - seconds
            for slot in self._slots:
                if not slot.armed or slot.abandoned or slot.since > started_before:
                    continue
                for job in slot.batch or ([slot.job] if slot.job else []):
                    if job.id not in slot.requests and job.cancel_requested_at is None:
                        wanted.append(job.id)
        return wanted

    def deliver(self, requests: Mapping[int, dt.datetime]) -> int:
        """Hand cancel requests to the jobs they name: a running one sees
        ``cancel_requested()`` at once and is interrupted ``cancel_notice`` seconds later; one of a
        batch that has not started yet will not start. Returns how many reached a job."""
        reached = 0
        with self._cond:
            deadline = time.monotonic() + self.cancel_notice
            for slot in self._slots:
                if slot.abandoned:
                    continue
                running = slot.armed and slot.job is not None and not slot.fired
                current = {job.id for job in slot.group}
                for job in slot.group if running else []:
                    if job.id in requests and job.cancel_requested_at is None:
                        job.cancel_requested_at = requests[job.id]
                        slot.reason = CANCEL
                        slot.deadline = min(slot.deadline, deadline)
                        reached += 1
                        self._cond.notify()
                for other in slot.batch:
                    if other.id not in current and other.id in requests:
                        slot.requests[other.id] = requests[other.id]
                        reached += 1
        return reached

    # ---- the watchdog thread ------------------------------------------------------------------
    def run(self) -> None:
        while True:
            stuck: list[Slot] = []
            with self._cond:
                if self.stopping:
                    return
                now = time.monotonic()
                wake_at = now + _LONGEST_NAP
                for slot in self._slots:
                    if slot.deadline == math.inf or slot.abandoned:
                        continue
                    if not slot.fired and now >= slot.deadline:
                        slot.fired = True
                        exc_type = HandlerCancelled if slot.reason == CANCEL else HandlerTimeout
                        if slot.interrupt is None or not slot.interrupt(exc_type):
                            _raise_in_thread(slot.thread_id, exc_type)
                    if slot.fired:
                        if now >= slot.deadline + self.grace:
                            slot.abandoned = True
                            slot.deadline = math.inf
                            stuck.append(slot)
                            continue
                        wake_at = min(wake_at, slot.deadline + self.grace)
                    else:
                        wake_at = min(wake_at, slot.deadline)
                for slot in stuck:
                    self._slots.remove(slot)
                if not stuck:
                    self._wake_at = wake_at
                    self._cond.wait(max(0.0, wake_at - now))
                    self._wake_at = math.inf
            for slot in stuck:
                threading.Thread(
                    target=self._give_up, args=(slot,), name="dbqueue-timeout", daemon=True
                ).start()
            self.iterations.add()

    def _give_up(self, slot: Slot) -> None:
        try:
            self.on_stuck(slot)
        except Exception:  # the worker logs what it could not clean up; the watchdog goes on
            log.exception("recovering from a stuck handler failed")


#: Seconds between looks at the running jobs; also how long a job runs before it is looked at.
POLL_INTERVAL = 0.5


class CancelPoller(Service):
    name = "dbqueue-cancels"

    def __init__(
        self,
        watchdog: Watchdog,
        engine: Engine,
        store: RequestStore,
        interval: float = POLL_INTERVAL,
    ) -> None:
        super().__init__()
        self.watchdog = watchdog
        self.engine = engine
        self.store = store
        self.interval = interval
        #: Requests handed to running jobs (for tests and logs).
        self.delivered = 0

    def run(self) -> None:
        failures = 0
        while not self.wait_for_stop(self.interval):
            failures = self._look(failures)
            self.iterations.add()

    def _look(self, failures: int) -> int:
        """One look at the running jobs; returns how many looks in a row have failed."""
        ids = self.watchdog.running_longer_than(self.interval)
        if not ids:
            return failures
        try:
            found = self.poll(ids)
        except Exception as exc:  # the database is away: the next look tries again
            failures += 1
            if failures == 1 or failures % 100 == 0:
                log.warning("could not read cancel requests: %s", first_line(exc))
            return failures
        if found:
            self._take(list(found))
            self.delivered += self.watchdog.deliver(found)
        return 0

    def _take(self, ids: list[int]) -> None:
        """Mark the requests taken before stopping their jobs (where the store needs it: see
        ``SideDatabaseRequests.take``); if that fails, the jobs are stopped all the same."""
        try:
            self.store.take(ids)
        except Exception as exc:
            log.warning("could not mark cancel requests taken: %s", first_line(exc))

    def poll(self, ids: list[int]) -> dict:
        if self.store.separate:  # in a database of its own: no connection of ours needed
            return self.store.pending(None, ids)  # type: ignore[arg-type]
        with self.engine.connect() as conn:
            return self.store.pending(conn, ids)

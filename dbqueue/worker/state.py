"""What a running worker's parts share: whether it stops, the signal idle threads sleep on, and
the counts. One object handed to each part, so that none reaches into another's attributes."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dbqueue.base.wakeup import WakeSignal

if TYPE_CHECKING:
    from dbqueue.worker.batch_result import BatchResult


@dataclass
class WorkerSummary:
    succeeded: int = 0
    failed: int = 0
    #: jobs stopped by a cancel request while they ran (``app.cancel``)
    cancelled: int = 0
    rounds: int = 0
    reconnects: int = 0
    #: threads given up because a handler stayed blocked past its timeout (each was replaced),
    #: or ran when the worker stopped at once
    abandoned_threads: int = 0
    started_at: float = field(default_factory=time.monotonic)

    @property
    def processed(self) -> int:
        return self.succeeded + self.failed + self.cancelled


class RunState:
    """A worker's run, as its threads see it: the stop request and deadline, the wake signal,
    the job budget (``max_jobs``) and the summary, the error that ends the run."""

    def __init__(self, max_jobs: int | None, shutdown_timeout: float | None = None) -> None:
        self.max_jobs = max_jobs
        #: Seconds a stop waits for running jobs before it stops at once; None: as long as
        #: they run.
        self.shutdown_timeout = shutdown_timeout
        self.summary = WorkerSummary()
        #: Set by stop(): running jobs finish, nothing new is claimed.
        self.stop_requested = threading.Event()
        #: Set by stop(now=True) (a second signal): running jobs are abandoned, not waited for.
        self.stop_now = threading.Event()
        #: Monotonic time of the first stop request (the shutdown timeout counts from it).
        self.stop_requested_at: float | None = None
        #: Idle threads sleep on it; a push, a local enqueue or stop() wakes them; a new due
        #: time replans the idle poller's sleep.
        self.signal = WakeSignal()
        #: Held by the idle thread that polls for the others.
        self.idle_poller = threading.Lock()
        #: Wake-ups sent before their enqueue's commit (``wake(early=True)``) so far.
        self.early_wakes = 0
        #: Monotonic time at which a job this process scheduled falls due (a retry), the
        #: earliest not yet passed; None: none known.
        self.due_at: float | None = None
        #: The database's next due time may have changed since the idle poller last read it.
        self.due_changed = False
        #: Monotonic time at which the worker stops (``max_runtime``); None: no limit.
        self.deadline: float | None = None
        #: An error no retry can fix (missing tables): the run ends and raises it.
        self.fatal: BaseException | None = None
        self._counts = threading.Lock()
        self._reserved = 0

    # ---- stopping and waking ------------------------------------------------------------------
    def stop(self, now: bool = False) -> None:
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
        if now:
            self.stop_now.set()
        self.stop_requested.set()
        self.signal.wake(everyone=True)

    def shutdown_overdue(self) -> bool:
        """The wait for running jobs has lasted the shutdown timeout: stop at once."""
        began = self.stop_requested_at
        if self.shutdown_timeout is None or began is None:
            return False
        return time.monotonic() >= began + self.shutdown_timeout

    def fail(self, exc: BaseException) -> None:
        """Stop the run for an error it cannot get past; ``run()`` raises it."""
        self.fatal = exc
        self.stop()

    def wake(self, early: bool = False) -> None:
        """Work is runnable: an idle thread looks. ``early``: its commit is under way, so the
        idle poller looks again a few times soon after."""
        if early:
            self.early_wakes += 1
        self.signal.wake()
        if early:
            self.signal.replan()

    def due_in(self, seconds: float | None, replan: bool = True) -> None:
        """A job falls due in ``seconds`` (None: none does): the idle poller sleeps no longer
        than that (``replan``: it plans its sleep again now). Told before the commit that
        schedules it: the time is known, the row may not be visible yet."""
        if seconds is None:
            return
        at = time.monotonic() + seconds
        with self._counts:
            if self.due_at is not None and self.due_at <= at:
                return
            self.due_at = at
        if replan:
            self.signal.replan()

    def look_again(self) -> None:
        """Jobs may have been scheduled for later (a wake-up found nothing runnable): the
        idle poller reads the next due time again before it sleeps on."""
        self.due_changed = True
        self.signal.replan()

    def next_due(self) -> tuple[float | None, bool]:
        """(the earliest due time this process knows of, whether to ask the database for its
        own since something changed)."""
        with self._counts:
            ask, self.due_changed = self.due_changed, False
            return self.due_at, ask

    def forget_passed(self, now: float) -> None:
        """After a round: a known due time that had passed is forgotten (the round claimed its
        job), and the database is asked for the next."""
        with self._counts:
            if self.due_at is not None and self.due_at <= now:
                self.due_at, self.due_changed = None, True

    @property
    def stopping(self) -> bool:
        return self.stop_requested.is_set() or (
            self.deadline is not None and time.monotonic() >= self.deadline
        )

    # ---- the job budget and the counts --------------------------------------------------------
    def budget_left(self) -> bool:
        if self.max_jobs is None:
            return True
        with self._counts:
            return self.summary.processed + self._reserved < self.max_jobs

    def reserve(self, wanted: int) -> int:
        """How many of ``wanted`` jobs a claim may take within ``max_jobs``, set aside."""
        if self.max_jobs is None:
            return wanted
        with self._counts:
            left = self.max_jobs - self.summary.processed - self._reserved
            granted = max(0, min(wanted, left))
            self._reserved += granted
            return granted

    def settle(self, reserved: int, result: BatchResult | None) -> None:
        """Return a claim's reservation and count what it committed."""
        with self._counts:
            if self.max_jobs is not None:
                self._reserved -= reserved
            if result is not None:
                self.summary.succeeded += result.succeeded
                self.summary.failed += result.failed
                self.summary.cancelled += result.cancelled

    def count_reconnect(self) -> None:
        with self._counts:
            self.summary.reconnects += 1

    def count_abandoned_thread(self) -> None:
        with self._counts:
            self.summary.abandoned_threads += 1

    def count_recorded(self, failed: int = 0, cancelled: int = 0) -> None:
        """Jobs of an abandoned thread, recorded for it."""
        with self._counts:
            self.summary.failed += failed
            self.summary.cancelled += cancelled

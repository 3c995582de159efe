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
        #: Idle threads sleep on it; a push, a local enqueue or stop() wakes them.
        self.signal = WakeSignal()
        #: Held by the idle thread that polls for the others.
        self.idle_poller = threading.Lock()
        #: Wake-ups sent before their enqueue's commit (``wake(early=True)``) so far.
        self.early_wakes = 0
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
        if early:
            self.early_wakes += 1
        self.signal.wake()

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

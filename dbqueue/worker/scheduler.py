"""The worker's periodic-jobs thread: asleep until the next tick of any schedule, then it
enqueues the ticks due (``dbqueue.runtime.periodic``: exactly once, whatever the number of workers).

Every worker runs one (``periodic=False`` / ``--no-periodic`` to opt out), off the claim
threads. It wakes at each tick, not on a poll; a check that fails (the database is away) is
tried again a second later, and ``catch_up`` decides what becomes of ticks missed meanwhile.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dbqueue.base.service import Service
from dbqueue.errors import DbqueueError
from dbqueue.runtime.periodic import Enqueued, enqueue_due
from dbqueue.tasks.schedules import UTC, Schedule

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext

log = logging.getLogger("dbqueue.periodic")

#: After a failed check: try again this soon.
RETRY_SECONDS = 1.0
#: Longest sleep, so that a wall-clock step (NTP) is noticed within a minute.
MAX_SLEEP_SECONDS = 60.0


class Scheduler(Service):
    name = "dbqueue-periodic"
    stop_timeout = 30.0

    def __init__(
        self,
        context: RuntimeContext,
        engine: Engine,
        schedules: Sequence[Schedule],
        enqueued: Enqueued | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.context = context
        self.engine = engine
        self.schedules = list(schedules)
        self.enqueued = enqueued
        self.clock = clock
        #: Schedule name → when (epoch seconds) to check it next; 0: at once.
        self._next_check = {s.name: 0.0 for s in self.schedules}
        self._failing = False

    def run(self) -> None:
        while not self.stopping:
            self.check(self.clock())
            self.iterations.add()
            wake_at = min(self._next_check.values())
            delay = min(wake_at - self.clock(), MAX_SLEEP_SECONDS)
            if delay > 0:
                self.wait_for_stop(delay)

    def check(self, now: float) -> None:
        """Enqueue the due ticks of the schedules whose check time has come."""
        due = [s for s in self.schedules if self._next_check[s.name] <= now]
        if not due:
            return
        when = dt.datetime.fromtimestamp(now, UTC)
        try:
            enqueue_due(self.context, self.engine, due, when, self.enqueued, lambda: self.stopping)
        except Exception as exc:  # the thread must outlive any failure: next try in a second
            self._failed(exc)
            for schedule in due:
                self._next_check[schedule.name] = now + RETRY_SECONDS
            return
        if self._failing:
            log.info("periodic schedules checked again after a failure")
            self._failing = False
        for schedule in due:
            following = schedule.next_after(when)
            self._next_check[schedule.name] = (
                following.timestamp() if following is not None else math.inf
            )

    def _failed(self, exc: Exception) -> None:
        if self._failing:
            return  # said once per outage
        self._failing = True
        if isinstance(exc, sa.exc.DBAPIError):
            first = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else ""
            log.warning("periodic check failed, retrying every %gs: %s", RETRY_SECONDS, first)
        elif isinstance(exc, DbqueueError):
            log.warning("periodic check failed, retrying every %gs: %s", RETRY_SECONDS, exc)
        else:
            log.exception("periodic check failed, retrying every %gs", RETRY_SECONDS)

"""The watchdog's side of cancellation, in memory (the contract suite runs it in real workers):
which jobs are worth a query, and where a request found for each goes."""

from __future__ import annotations

import datetime as dt

from dbqueue import Job
from dbqueue.worker.watchdog import CANCEL, Watchdog


def test_a_request_reaches_the_running_job_or_keeps_a_batch_mate_from_starting():
    watchdog = Watchdog(grace=5.0, on_stuck=lambda slot: None, cancel_notice=1.0)
    slot = watchdog.slot(0)
    first, second, third = Job(id=1, task="a"), Job(id=2, task="b"), Job(id=3, task="c")
    slot.batch = [first, second, third]
    assert watchdog.arm(slot, first, None)
    assert watchdog.running_longer_than(0.5) == []  # just started: not worth a query
    slot.since -= 10
    assert watchdog.running_longer_than(0.5) == [1, 2, 3]

    asked = dt.datetime.now(dt.timezone.utc)
    assert watchdog.deliver({1: asked, 2: asked}) == 2
    assert first.cancel_requested() and not second.cancel_requested()
    assert (slot.reason, slot.fired) == (CANCEL, False)  # interrupted only after the notice
    assert slot.deadline != float("inf")
    assert watchdog.running_longer_than(0.5) == [3]  # the requests already found are not asked
    assert watchdog.disarm(slot) is False

    assert watchdog.arm(slot, second, None) is False  # it must not start
    assert second.cancel_requested()
    assert watchdog.arm(slot, third, None) is True
    assert not third.cancel_requested() and slot.reason != CANCEL
    watchdog.disarm(slot)
    assert watchdog.deliver({3: asked}) == 0  # too late: it has finished
    assert not third.cancel_requested()

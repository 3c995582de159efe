"""Where metrics and tracing plug in: observers of enqueues and of job runs.

An App's contexts share one ``Instruments`` (``context.instruments``). Empty — the default —
it costs an enqueue one truth test and a worker nothing: the executor wraps its handlers and
the worker starts the finished-jobs writer only for observers that are there. ``dbqueue.metrics``
and ``dbqueue.tracing`` add themselves here; so may an application's own code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

#: Called before an INSERT of jobs (it may set their ``traceparent``); returns what to call
#: after it, with the new ids (empty when the database returned none) or the error raised.
After = Callable[[Sequence[int], BaseException | None], None]
EnqueueObserver = Callable[[Sequence[Any]], After]
#: ``run_one(session, job) -> Outcome`` → the same, wrapped (e.g. in a consumer span).
RunOne = Callable[[Any, Any], Any]
RunWrapper = Callable[[RunOne], RunOne]
#: Called on the worker's finished-jobs thread, after the outcome committed, with the job, what
#: happened ("succeeded", "failed" — it runs again —, "dead" or "cancelled") and seconds it ran.
FinishedObserver = Callable[[Any, str, float], None]


class Instruments:
    """The observers of one App (and every context reconfigured from it)."""

    def __init__(self) -> None:
        self.enqueue: tuple[EnqueueObserver, ...] = ()
        self.run: tuple[RunWrapper, ...] = ()
        self.finished: tuple[FinishedObserver, ...] = ()

    def add(
        self,
        *,
        enqueue: EnqueueObserver | None = None,
        run: RunWrapper | None = None,
        finished: FinishedObserver | None = None,
    ) -> None:
        """Add observers (tuples are replaced, not mutated: readers on other threads see one
        whole set or the other)."""
        if enqueue is not None:
            self.enqueue = (*self.enqueue, enqueue)
        if run is not None:
            self.run = (*self.run, run)
        if finished is not None:
            self.finished = (*self.finished, finished)

    def wrap_run(self, run_one: RunOne) -> RunOne:
        for wrapper in self.run:
            run_one = wrapper(run_one)
        return run_one


def observed_insert(
    observers: Sequence[EnqueueObserver], jobs: Sequence[Any], insert: Callable[[], list[int]]
) -> list[int]:
    """Run ``insert`` between the observers' before and after calls."""
    afters = [observer(jobs) for observer in observers]
    try:
        ids = insert()
    except BaseException as exc:
        for after in afters:
            after((), exc)
        raise
    for after in afters:
        after(ids, None)
    return ids

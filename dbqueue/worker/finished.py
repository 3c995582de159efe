"""The end of awaited jobs (``app.call``), pushed to their callers through the lock server once
the transaction that records it commits. (PostgreSQL's NOTIFY needs none of this: the engine
sends it inside that transaction.) Without a lock server nothing here runs per job."""

from __future__ import annotations

from collections.abc import Iterable

from dbqueue.base.wakeup import Notifier
from dbqueue.job import Job


class FinishedJobs:
    """One worker thread's awaited jobs whose outcomes its open transaction writes."""

    def __init__(self, notifier: Notifier | None, channel: str) -> None:
        #: Where the end is pushed, if anywhere: only then are ids collected.
        self.notifier = notifier if notifier is not None and notifier.announces_finished else None
        self.channel = channel
        self._ids: list[int] = []

    def note(self, jobs: Iterable[Job]) -> None:
        """These jobs' outcomes are in the transaction (finished or not: a caller woken for a
        retry looks, and waits on)."""
        if self.notifier is not None:
            self._ids += [job.id for job in jobs if job.awaited]

    def drop(self) -> None:
        """The transaction did not commit (or a new one starts)."""
        self._ids = []

    def committed(self) -> None:
        if self._ids:
            ids, self._ids = self._ids, []
            assert self.notifier is not None
            self.notifier.announce_finished(self.channel, ids)

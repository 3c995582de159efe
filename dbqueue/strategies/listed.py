"""Runnable ids listed once for several claims of one process (locks outside the database).

A claim whose locks live outside the database (the lock server) lists runnable ids, locks some
and marks them running: three steps, where a claim with row or named locks in SQL needs one
statement. Listing a few hundred ids at once and handing them out to the process's claims in
turn spares most of the listings: the next claims only lock and mark.

An id listed a moment ago may have been claimed, cancelled or rescheduled since: its lock is
then held by another worker, or the mark (``status = 'available' AND run_at <= now``, a
compare-and-set) passes it by, and the list is dropped (``forget``) to be listed afresh. So a
list is never trusted, only used to choose what to try; and it is listed again when it holds
less than a claim wants, or is older than ``max_age``, so that a job enqueued later with a
higher priority waits at most that long behind the ones listed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

#: How many ids one listing reads: about twenty claims of ten jobs.
LIST_SIZE = 200
#: How long a list is used at most (seconds).
MAX_AGE = 0.1


@dataclass
class _Listed:
    ids: deque[int] = field(default_factory=deque)
    listed_at: float = 0.0


class ListedCandidates:
    """Ids listed per queue, shared by a process's claim threads (and async slots).

    No lock is held while listing: an async slot's claim runs on the event loop's thread, where
    waiting on a thread lock held across another slot's query would stop the loop. Two claims
    that list at once each keep a different part of their listing (``part``), and the list left
    is the last one's; an id tried twice is refused by its lock.
    """

    def __init__(self, size: int = LIST_SIZE, max_age: float = MAX_AGE) -> None:
        self.size = size
        self.max_age = max_age
        self._lists: dict[str, _Listed] = {}
        self._mutex = threading.Lock()

    def take(
        self, queue: str, limit: int, part: int, list_ids: Callable[[int], list[int]]
    ) -> list[int]:
        """Up to ``limit`` ids of ``queue`` to try, in claim order. Listed with ``list_ids``
        (given how many) when the list holds fewer than ``limit`` (a claim gets a full batch
        while the queue has one) or is too old, this claim then keeping the ``part``-th
        ``limit`` of the listing, or the first if the listing is shorter."""
        now = time.monotonic()
        with self._mutex:
            listed = self._lists.get(queue)
            if (
                listed is not None
                and len(listed.ids) >= limit
                and now - listed.listed_at <= self.max_age
            ):
                return [listed.ids.popleft() for _ in range(limit)]
        ids = list_ids(self.size)
        start = part * limit if part * limit < len(ids) else 0
        mine = ids[start : start + limit]
        with self._mutex:
            self._lists[queue] = _Listed(deque(ids[:start] + ids[start + limit :]), now)
        return mine

    def forget(self, queue: str) -> None:
        """Drop ``queue``'s list: one of its ids could not be marked (the list is stale)."""
        with self._mutex:
            self._lists.pop(queue, None)

"""The worker's cancel poller: finds the cancel requests (``app.cancel``) of the jobs it runs.

One thread per Worker. Every ``POLL_INTERVAL`` seconds it asks the watchdog, in memory, which
jobs belong to batches whose current handler has run at least that long; only then does it read
the requests of those ids (one indexed query, a plain read that never waits for a lock), and
hands any it finds to the watchdog, which makes ``job.cancel_requested()`` true and enforces the
request like a timeout. Short jobs never cost a query: a request reaches a job within about
``POLL_INTERVAL`` (plus the query) once it has run that long.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy.engine import Engine

from dbqueue.base.service import Service
from dbqueue.worker.process import first_line
from dbqueue.worker.watchdog import Watchdog

if TYPE_CHECKING:
    from dbqueue.engine.cancels import RequestStore

log = logging.getLogger("dbqueue.worker")

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

"""SQLite's commits, seen from an idle worker or a waiting caller: ``PRAGMA data_version``.

SQLite has no NOTIFY. But every process using the database shares its WAL index in memory, and
``PRAGMA data_version`` on a connection of its own changes whenever another connection commits a
change: reading it costs a few microseconds and no disk. A thread per worker process reads it
every ``CHECK_INTERVAL`` and wakes an idle thread when it moved, so a job inserted from
anywhere (another process, plain SQL) is claimed within milliseconds instead of at the next
poll, and a caller of ``app.call`` looks at its job again as soon as a commit may have ended
it. It only wakes: the worker still polls as before (a delayed job falling due changes
nothing), so a watch that fails costs latency, never a job.

A commit that changes no page (an empty claim) leaves the version as it was, so idle workers
do not wake one another.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable, Sequence

from sqlalchemy.engine import URL

from dbqueue.base.wakeup import ServedNotifier

#: Mean seconds between two reads of the version: half of it is the mean wait it adds to a
#: wake-up.
CHECK_INTERVAL = 0.01


class CommitWatcher(ServedNotifier):
    """Wakes a worker's idle threads after any commit by another connection. ``pushes`` stays
    False: the fallback poll keeps its short interval, since nothing here sees a job fall due."""

    serves = "watching SQLite's commits"

    @property
    def wake_mode(self) -> str:
        return "polling, woken by commits (PRAGMA data_version)"

    def __init__(self, url: URL) -> None:
        super().__init__()
        self.url = url
        self._conn: sqlite3.Connection | None = None
        self._version = 0

    def start(self, on_wake: Callable[[], None], queues: Sequence[str] = ()) -> None:
        self._start_serving(lambda: self._watch(on_wake), "dbqueue-watch")

    def open(self) -> None:
        """Connect, and take the version as it is now."""
        uri = str(self.url.query.get("uri", "")).lower() in ("true", "1")
        assert self.url.database is not None  # check_url refuses a database without a file
        self._conn = sqlite3.connect(self.url.database, uri=uri, check_same_thread=False)
        self._conn.isolation_level = None  # each read its own transaction: it sees the last commit
        self._version = _version(self._conn)

    def changed(self) -> bool:
        """Whether another connection committed a change since the last look."""
        assert self._conn is not None
        now = _version(self._conn)
        moved, self._version = now != self._version, now
        return moved

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _watch(self, on_wake: Callable[[], None]) -> None:
        """One connection's watch, until stopped; a wake after each change, and once connected:
        anything may have been committed while nobody watched."""
        try:
            self.open()
            self._connected()
            on_wake()
            # Jittered: two processes watching on the same beat (a caller of app.call and its
            # worker) would lock in phase, each commit landing just after a look.
            while not self._stop.wait(CHECK_INTERVAL * random.uniform(0.5, 1.5)):
                if self.changed():
                    on_wake()
        finally:
            self.close()


class FinishWatcher(CommitWatcher):
    """For callers waiting on jobs (``app.call``): ``on_finished(None)``, look again, after
    each commit by another connection, a job's end among them."""

    def __init__(self, url: URL, on_finished: Callable[[list[int] | None], None]) -> None:
        super().__init__(url)
        self.on_finished = on_finished

    def start(self, on_wake: Callable[[], None] | None = None, queues: Sequence[str] = ()) -> None:
        super().start(lambda: self.on_finished(None), queues)


def _version(conn: sqlite3.Connection) -> int:
    row = conn.execute("PRAGMA data_version").fetchone()
    return int(row[0])

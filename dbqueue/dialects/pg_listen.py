"""PostgreSQL LISTEN/NOTIFY: the insert trigger notifies, one thread per worker process listens.

LISTEN needs a dedicated autocommit connection that never goes back to the pool in LISTEN state
(it is detached), polled with select() — psycopg2 delivers notifications on ``conn.poll()``.
NOTIFY is transactional (sent on commit, duplicates within a transaction collapse), and a lost
notification only delays a job until the fallback poll. LISTEN does not work through PgBouncer
in transaction-pooling mode: point workers at PostgreSQL directly.
"""

from __future__ import annotations

import logging
import select
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dbqueue.base import results
from dbqueue.base.wakeup import ServedNotifier

log = logging.getLogger("dbqueue.wakeup")


class PgNotifier(ServedNotifier):
    """Wakes a worker's idle threads for each notification of an insert (its payload: the
    queue); notices that awaited jobs finished (``dbqueue.base.results``) are for callers, not
    workers, and wake nobody here."""

    pushes = True
    serves = "the LISTEN connection"

    def __init__(self, engine: Engine, channel: str) -> None:
        super().__init__()
        self.engine = engine
        self.channel = channel

    def start(self, on_wake: Callable[[], None], queues: Sequence[str] = ()) -> None:
        def deliver(payloads: list[str] | None) -> None:
            if payloads is None or any(results.finished_ids(p) is None for p in payloads):
                on_wake()

        self._start(deliver)

    def _start(self, deliver: Callable[[list[str] | None], None]) -> None:
        self._start_serving(lambda: self._listen(deliver), "dbqueue-listen")

    def notify(self, conn: Connection, queues: Sequence[str]) -> int:
        for queue in queues:
            conn.execute(sa.select(sa.func.pg_notify(self.channel, queue)))
        return len(queues)

    def _listen(self, deliver: Callable[[list[str] | None], None]) -> None:
        """One connection's LISTEN, until stopped; ``deliver`` gets each round's payloads, and
        None once connected: anything may have happened while nobody listened."""
        raw = self.engine.raw_connection()
        dbapi = raw.driver_connection
        try:
            raw.detach()  # never back to the pool in LISTEN state
            dbapi.autocommit = True
            quoted = self.engine.dialect.identifier_preparer.quote_identifier(self.channel)
            with dbapi.cursor() as cursor:
                cursor.execute(f"LISTEN {quoted}")  # no Core construct for LISTEN
            log.debug("listening on %s", quoted)
            self._connected()
            deliver(None)
            while not self._stop.is_set():
                ready, _, _ = select.select([dbapi], [], [], 1.0)
                if ready:
                    dbapi.poll()
                    if dbapi.notifies:
                        payloads = [n.payload for n in dbapi.notifies]
                        dbapi.notifies.clear()
                        deliver(payloads)
        finally:
            try:
                dbapi.close()
            except Exception:
                log.debug("closing the LISTEN connection failed", exc_info=True)


class PgFinishListener(PgNotifier):
    """For callers waiting on jobs (``app.call``): ``on_finished(job_ids)`` for each notice
    that awaited jobs finished, ``on_finished(None)`` after each (re)connect."""

    def __init__(
        self, engine: Engine, channel: str, on_finished: Callable[[list[int] | None], None]
    ) -> None:
        super().__init__(engine, channel)
        self.on_finished = on_finished

    def start(self, on_wake: Callable[[], None] | None = None, queues: Sequence[str] = ()) -> None:
        def deliver(payloads: list[str] | None) -> None:
            if payloads is None:
                self.on_finished(None)
                return
            ids = [i for p in payloads for i in results.finished_ids(p) or ()]
            if ids:
                self.on_finished(ids)

        self._start(deliver)

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
import threading
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from .. import results
from ..wakeup import Notifier

log = logging.getLogger("dbqueue.wakeup")

MAX_BACKOFF = 30.0


class PgNotifier(Notifier):
    """Wakes a worker's idle threads for each notification of an insert (its payload: the
    queue); notices that awaited jobs finished (``dbqueue.results``) are for callers, not
    workers, and wake nobody here."""

    pushes = True

    def __init__(self, engine: Engine, channel: str) -> None:
        self.engine = engine
        self.channel = channel
        self.listening = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, on_wake: Callable[[], None], queues: Sequence[str] = ()) -> None:
        def deliver(payloads: list[str] | None) -> None:
            if payloads is None or any(results.finished_ids(p) is None for p in payloads):
                on_wake()

        self._start(deliver)

    def _start(self, deliver: Callable[[list[str] | None], None]) -> None:
        self._thread = threading.Thread(
            target=self._listen, args=(deliver,), name="dbqueue-listen", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def notify(self, conn: Connection, queues: Sequence[str]) -> int:
        for queue in queues:
            conn.execute(sa.select(sa.func.pg_notify(self.channel, queue)))
        return len(queues)

    def _listen(self, deliver: Callable[[list[str] | None], None]) -> None:
        """Listen until stopped; ``deliver`` gets each round's payloads, and None after each
        (re)connect: anything may have happened while nobody listened."""
        backoff = 0.5
        while not self._stop.is_set():
            dbapi = None
            try:
                raw = self.engine.raw_connection()
                dbapi = raw.driver_connection
                raw.detach()  # never back to the pool in LISTEN state
                dbapi.autocommit = True
                quoted = self.engine.dialect.identifier_preparer.quote_identifier(self.channel)
                with dbapi.cursor() as cursor:
                    cursor.execute(f"LISTEN {quoted}")  # no Core construct for LISTEN
                log.debug("listening on %s", quoted)
                self.listening.set()
                deliver(None)  # anything that happened while we were not listening
                backoff = 0.5
                while not self._stop.is_set():
                    ready, _, _ = select.select([dbapi], [], [], 1.0)
                    if ready:
                        dbapi.poll()
                        if dbapi.notifies:
                            payloads = [n.payload for n in dbapi.notifies]
                            dbapi.notifies.clear()
                            deliver(payloads)
            except Exception as exc:  # connection lost: reconnect with backoff
                self.listening.clear()
                log.warning("LISTEN connection failed (%s); retrying in %.1fs", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)
            finally:
                if dbapi is not None:
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

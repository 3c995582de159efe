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

from ..wakeup import Notifier

log = logging.getLogger("dbqueue.wakeup")

MAX_BACKOFF = 30.0


class PgNotifier(Notifier):
    pushes = True

    def __init__(self, engine: Engine, channel: str) -> None:
        self.engine = engine
        self.channel = channel
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, on_wake: Callable[[], None], queues: Sequence[str] = ()) -> None:
        self._thread = threading.Thread(
            target=self._listen, args=(on_wake,), name="dbqueue-listen", daemon=True
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

    def _listen(self, on_wake: Callable[[], None]) -> None:
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
                on_wake()  # anything inserted while we were not listening
                backoff = 0.5
                while not self._stop.is_set():
                    ready, _, _ = select.select([dbapi], [], [], 1.0)
                    if ready:
                        dbapi.poll()
                        if dbapi.notifies:
                            dbapi.notifies.clear()
                            on_wake()
            except Exception as exc:  # connection lost: reconnect with backoff
                log.warning("LISTEN connection failed (%s); retrying in %.1fs", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)
            finally:
                if dbapi is not None:
                    try:
                        dbapi.close()
                    except Exception:
                        log.debug("closing the LISTEN connection failed", exc_info=True)

"""Wake-ups through the lock server: idle workers subscribe, enqueuers hint, the server pushes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from sqlalchemy.engine import Connection

from dbqueue.base import results
from dbqueue.base.wakeup import Notifier
from dbqueue.lockserver.client import LockServerClient, Send

log = logging.getLogger("dbqueue.wakeup")


class LockServerNotifier(Notifier):
    """The server pushes "work available" per queue: after an enqueue's hint at once, and for
    everything else (plain SQL inserts, due retries, delayed jobs) when its poll of the table
    finds runnable jobs (CHECK_TASKS_INTERVAL). The connection belongs to the strategy that made
    this notifier, which closes it."""

    pushes = True

    def __init__(self, client: LockServerClient) -> None:
        self.client = client
        self._subscription: int | None = None
        self._on_wake: Callable[[], None] | None = None

    def start(self, on_wake: Callable[[], None], queues: Sequence[str] = ()) -> None:
        self._on_wake = on_wake
        self.client.add_connect_hook(self._connected)
        self._subscription = self.client.subscribe(queues, lambda queue: on_wake())

    def stop(self) -> None:
        if self._subscription is not None:
            self.client.unsubscribe(self._subscription)
            self._subscription = None
        self.client.remove_connect_hook(self._connected)

    def notify(self, conn: Connection, queues: Sequence[str]) -> int:
        self.client.hint(queues)
        return len(queues)

    announces_finished = True

    def announce_finished(self, channel: str, job_ids: Sequence[int]) -> None:
        self.client.hint([results.finished_name(channel, job_id) for job_id in job_ids])

    def _connected(self, send: Send) -> None:
        # Jobs enqueued while this process was not connected were pushed to nobody.
        if self._on_wake is not None:
            self._on_wake()

"""The worker's row in the registry of live workers (``<jobs>_workers``), kept current by a
thread of its own: the claim loop's threads never wait on it.

At start the row says who the worker is (host, pid, queues, concurrency, strategy); every
``interval`` seconds the heartbeat writes what runs now (read from the watchdog's slots, in
memory) and the counters the worker keeps anyway (its summary), and pushes ``expires_at`` on.
At exit the row is deleted. A worker killed without a word leaves a row that expires: readers
show it as gone and maintenance deletes it. Each beat also moves on the leases of the jobs the
worker runs outside their claim's transaction (``leased.py``).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Engine

from dbqueue.base.service import Service
from dbqueue.job import Job
from dbqueue.runtime.context import RuntimeContext
from dbqueue.worker.leased import LeaseBook

log = logging.getLogger("dbqueue.worker")

#: Seconds between heartbeats (``Worker(heartbeat_interval=…)``).
DEFAULT_HEARTBEAT_INTERVAL = 5.0
#: A row is live for this many intervals after its last heartbeat.
EXPIRES_AFTER_BEATS = 4
#: Jobs listed in a row (a worker of huge concurrency reports the first ones and the count).
MAX_LISTED_JOBS = 200

Running = Callable[[], list[tuple[Job, float]]]
Counters = Callable[[], tuple[int, int]]


class Heartbeat(Service):
    """One worker process's registry row and the thread that keeps it alive."""

    name = "dbqueue-heartbeat"
    stop_timeout = 10.0

    def __init__(
        self,
        context: RuntimeContext,
        engine: Engine,
        identity: dict[str, Any],
        running: Running,
        counters: Counters,
        interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        leases: LeaseBook | None = None,
    ) -> None:
        super().__init__()
        self.context = context
        #: The jobs table's database, where the leases of the jobs this worker runs are.
        self.jobs_engine = engine
        self.leases = leases
        #: The registry's database: the queue's, or its side file (SQLite).
        self.engine = context.workers_side_engine() or engine
        self.id = uuid.uuid4().hex
        self.identity = {
            "id": self.id,
            "host": socket.gethostname()[:255],
            "pid": os.getpid(),
            **identity,
        }
        self.running = running
        self.counters = counters
        self.interval = interval
        self.ttl = interval * EXPIRES_AFTER_BEATS

    def before_start(self) -> None:
        """Insert the row now, so the worker is listed as soon as it runs."""
        try:
            self._register()
        except Exception as exc:  # the registry is for people watching: never stop a worker
            log.warning("could not register the worker in %s: %s", self._table(), _line(exc))

    def run(self) -> None:
        while not self.wait_for_stop(self.interval):
            try:
                self.beat()
            except Exception as exc:  # database down: the next beat tries again
                log.debug("heartbeat failed: %s", _line(exc))
            self.iterations.add()

    def after_stop(self) -> None:
        """The row goes: this worker runs nothing any more."""
        try:
            with self.engine.begin() as conn:
                self.context.queue_engine(conn).workers.unregister_worker(conn, self.id)
        except Exception as exc:  # it expires, and maintenance deletes it
            log.debug("could not delete the worker's row: %s", _line(exc))

    def beat(self) -> None:
        if self.leases is not None and self.leases.held():
            self.extend_leases()
        values = self.snapshot()
        with self.engine.begin() as conn:
            engine = self.context.queue_engine(conn)
            if engine.workers.heartbeat_worker(conn, self.id, values, self.ttl):
                return
        self._register()  # deleted as stale after a stall: back in the registry

    def extend_leases(self) -> None:
        """Move on the leases of the jobs running outside their claim's transaction: first,
        so that a slow registry write never costs a lease."""
        assert self.leases is not None
        try:
            with self.jobs_engine.begin() as conn:
                self.leases.extend(conn, self.context.queue_engine(conn))
        except Exception as exc:  # the database is away: the next beat tries again
            log.warning("could not move the leases of running jobs on: %s", _line(exc))

    def snapshot(self) -> dict[str, Any]:
        """What the worker runs and has done, from memory."""
        running = self.running()
        processed, failed = self.counters()
        wall = time.time()
        jobs = [
            {
                "id": job.id,
                "queue": job.queue,
                "task": job.task,
                "attempt": job.attempt,
                "since": dt.datetime.fromtimestamp(wall - seconds, dt.timezone.utc).isoformat(),
            }
            for job, seconds in running[:MAX_LISTED_JOBS]
        ]
        return {"running": len(running), "jobs": jobs, "processed": processed, "failed": failed}

    def _register(self) -> None:
        with self.engine.begin() as conn:
            engine = self.context.queue_engine(conn)
            engine.workers.unregister_worker(conn, self.id)
            engine.workers.register_worker(conn, {**self.identity, **self.snapshot()}, self.ttl)

    def _table(self) -> str:
        return self.context.names.workers


def _line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

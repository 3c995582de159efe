"""Leader-only maintenance: purge, rescue and re-notify, without a central node.

Every worker process runs a maintenance thread. Routines fire on clock minutes (the seed's
crontab-style lists, e.g. QUEUE_MINUTE_PURGE_THREAD=0), so all workers meet on the same tick;
a compare-and-set on the routine's row in ``<jobs>_maintenance`` lets exactly one of them run
that tick (and records who, when and what happened), and a named lock keeps a long run from
overlapping the next tick's. The others go back to sleep.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dbqueue import dialects
from dbqueue.base.service import Service
from dbqueue.base.wakeup import Notifier
from dbqueue.config import MaintenanceSettings
from dbqueue.engine import QueueEngine
from dbqueue.errors import ConfigurationError, DbqueueError
from dbqueue.runtime import cancellation
from dbqueue.strategies import ClaimStrategy
from dbqueue.strategies.base import Fence
from dbqueue.strategies.locks import job_lock_name, routine_lock_name

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext

log = logging.getLogger("dbqueue.maintenance")

RESCUE_BATCH = 1000


@dataclass(frozen=True)
class Routine:
    name: str
    minutes: tuple[int, ...]
    run: Callable[[Connection, QueueEngine], str]


class Maintenance(Service):
    """The maintenance thread: on each tick, the routines due whose tick this worker wins."""

    name = "dbqueue-maintenance"
    stop_timeout = 30.0

    def __init__(
        self,
        context: RuntimeContext,
        engine: Engine,
        strategy: ClaimStrategy,
        notifier: Notifier,
        settings: MaintenanceSettings,
        worker_id: str,
    ) -> None:
        super().__init__()
        self.context = context
        self.engine = engine
        self.strategy = strategy
        self.notifier = notifier
        self.settings = settings
        self.worker_id = worker_id
        self.routines = {
            r.name: r
            for r in (
                Routine("purge", settings.purge_minutes, self.purge),
                Routine("rescue", settings.rescue_minutes, self.rescue),
                Routine("renotify", settings.notify_minutes, self.renotify),
            )
        }
        self.last_result = ""

    # ---- scheduling ---------------------------------------------------------------------------
    def run(self) -> None:
        period = self.settings.tick_seconds
        while not self.stopping:
            now = time.time()
            tick = (math.floor(now / period) + 1) * period
            if self.wait_for_stop(tick - now):
                return
            slot = round(tick / period) % 60
            for routine in self.routines.values():
                if slot in routine.minutes and not self.stopping:
                    self._run_guarded(routine.name, tick)
            self.iterations.add()

    def _run_guarded(self, name: str, tick: float) -> None:
        """One routine's tick; whatever fails is said, and the next tick comes all the same."""
        try:
            self.run_tick(name, tick)
        except sa.exc.DBAPIError as exc:  # database down or restarting: next tick
            log.warning(
                "maintenance routine %s skipped a tick: database error (%s)",
                name,
                _first_line(exc.orig),
            )
        except DbqueueError as exc:  # e.g. the lock server is unreachable: next tick
            log.warning("maintenance routine %s not run: %s", name, exc)
        except Exception:  # a failing routine must not stop the others or the worker
            log.exception("maintenance routine %s failed", name)

    def run_now(self, name: str) -> str:
        """Run a routine outside the schedule (recorded like a tick); returns its result."""
        if not self.run_tick(name, time.time()):
            return "not run: a later tick is already recorded"
        return self.last_result

    def run_tick(self, name: str, tick: float) -> bool:
        """Run routine ``name`` for the tick at epoch ``tick`` if this worker wins it."""
        routine = self.routines[name]
        when = dt.datetime.fromtimestamp(tick, dt.timezone.utc)
        with self.engine.connect() as conn:
            engine = self.context.queue_engine(conn)
            with conn.begin():
                won = engine.housekeeping.claim_tick(conn, name, when, self.worker_id)
            if not won:
                log.debug("%s tick %s: another worker has it", name, when.isoformat())
                return False
            locks = self.strategy.liveness_locks
            lock = routine_lock_name(engine.tables.names.qualified_jobs, name)
            if locks is not None and not locks.try_acquire(conn, [lock])[0]:
                result = "skipped: the previous run is still going"
            else:
                try:
                    result = routine.run(conn, engine)
                except Exception as exc:
                    if isinstance(exc, sa.exc.DBAPIError):
                        raise  # the connection is gone: nothing can be recorded this tick
                    if isinstance(exc, DbqueueError):  # e.g. the lock server went away: expected
                        log.warning("%s stopped: %s", name, exc)
                    else:
                        log.exception("%s failed", name)
                    result = f"failed: {type(exc).__name__}: {exc}"
                    conn.rollback()
                finally:
                    if locks is not None:
                        locks.release(conn, [lock])
            with conn.begin():
                engine.housekeeping.record_tick(conn, name, when, result)
        self.last_result = result
        log.info("%s (tick %s): %s", name, when.strftime("%H:%M:%S"), result)
        return True

    # ---- routines -----------------------------------------------------------------------------
    def purge(self, conn: Connection, engine: QueueEngine) -> str:
        """Delete finished jobs older than the retention, one bounded chunk per transaction."""
        days, limit = self.settings.purge_max_age_days, self.settings.purge_limit
        total = chunks = 0
        while not self.stopping:
            with conn.begin():
                deleted = engine.housekeeping.purge_chunk(conn, days, limit)
            total += deleted
            chunks += 1
            if deleted < limit:
                break
        with conn.begin():
            requests = cancellation.forget_ended(self.context, conn)
        result = f"deleted {total} finished jobs older than {days:g} days in {chunks} chunk(s)" + (
            f", and the cancel requests of {requests} ended job(s)" if requests else ""
        )
        ticks = self._purge_periodic_ticks(conn, engine)
        return f"{result}; {ticks} periodic tick(s)" if ticks else result

    def _purge_periodic_ticks(self, conn: Connection, engine: QueueEngine) -> int:
        """The periodic ticks older than the retention, each schedule's last one kept."""
        days, limit = self.settings.purge_max_age_days, self.settings.purge_limit
        total = 0
        while not self.stopping:
            with conn.begin():
                deleted = engine.periodic.purge_periodic_ticks(conn, days, limit)
            total += deleted
            if deleted < limit:
                break
        return total

    def rescue(self, conn: Connection, engine: QueueEngine) -> str:
        """Retry ``running`` jobs whose worker died, and forget the workers whose heartbeat
        expired (their rows in the registry of live workers)."""
        result = self._rescue_jobs(conn, engine)
        with conn.begin(), self.context.workers_connection(conn) as registry:
            gone = self.context.queue_engine(registry).workers.forget_gone_workers(registry)
        if gone:
            result += f"; forgot {len(gone)} gone worker(s): {', '.join(gone[:20])}"
        return result

    def _rescue_jobs(self, conn: Connection, engine: QueueEngine) -> str:
        """Retry ``running`` jobs whose worker died: their lease ended, or their lock is free
        for anyone to take."""
        leased = self._rescue_leased(conn, engine)
        locked = self._rescue_locked(conn, engine)
        return f"{leased}; {locked}" if leased else locked

    def _rescue_leased(self, conn: Connection, engine: QueueEngine) -> str:
        """Retry the jobs whose lease ended (their worker stopped heartbeating), each fenced
        by its lease still being over: a late heartbeat keeps its job."""
        with conn.begin():
            expired = engine.queries.lease_expired(conn, RESCUE_BATCH)
        rescued: list[int] = []
        fence = Fence.lease_ended(self.worker_id)
        for job in expired:
            message = (
                f"the worker running this job ({job.worker_id}) stopped heartbeating: its lease "
                f"ended before the job finished; rescued by {self.worker_id}"
            )
            failure = self.context.retry_policy.failure(job, message)
            with conn.begin():
                if engine.outcomes.fail(conn, job, fence, failure).changed:
                    rescued.append(job.id)
            self.context.local_workers.due_in(failure.retry_in)
        if not rescued:
            return ""
        ids = ", ".join(str(job_id) for job_id in rescued[:20])
        return f"rescued {len(rescued)} job(s) whose lease ended: {ids}"

    def _rescue_locked(self, conn: Connection, engine: QueueEngine) -> str:
        """Retry the jobs committed ``running`` under a lock that is free now."""
        locks = self.strategy.liveness_locks
        with conn.begin():
            running = engine.queries.running_jobs(conn, RESCUE_BATCH)
        if not running:
            return "no running jobs"
        if locks is None:
            return (
                f"{len(running)} running job(s) left alone: this database has no named locks "
                "to tell a live worker from a dead one"
            )
        namespace = engine.tables.names.qualified_jobs
        names = [job_lock_name(namespace, job.id) for job in running]
        acquired = locks.try_acquire(conn, names)
        orphans = [job for job, got in zip(running, acquired, strict=True) if got]
        rescued: list[int] = []
        rescue = Fence.rescue(self.worker_id)
        try:
            for job in orphans:
                message = (
                    f"the worker running this job ({job.worker_id}) died: its lock was "
                    f"released before the job finished; rescued by {self.worker_id}"
                )
                failure = self.context.retry_policy.failure(job, message)
                with conn.begin():
                    failed = engine.outcomes.fail(conn, job, rescue, failure)
                self.context.local_workers.due_in(failure.retry_in)
                if failed.changed:  # else it finished (or was given back) since it was listed
                    rescued.append(job.id)
        finally:
            locks.release(conn, [n for n, got in zip(names, acquired, strict=True) if got])
        if not rescued:
            return f"{len(running)} running job(s), all held by live workers"
        ids = ", ".join(str(job_id) for job_id in rescued[:20])
        return f"rescued {len(rescued)} job(s) whose worker died: {ids}"

    def renotify(self, conn: Connection, engine: QueueEngine) -> str:
        """Wake workers for runnable jobs no insert notified: due retries, delayed jobs, jobs
        enqueued while no worker listened, and notifications lost in a reconnect."""
        if not self.notifier.pushes:
            return "no push channel here: workers poll"
        with conn.begin():
            queues = engine.queries.runnable_queues(conn)
            sent = self.notifier.notify(conn, queues)
        return f"notified {sent} queue(s): {', '.join(queues)}" if queues else "nothing runnable"


ROUTINES = ("purge", "rescue", "renotify")


def run_once(context: RuntimeContext, routine: str) -> str:
    """Run one routine now, as the workers' leader would, recording it; returns what it did.
    The context's strategy decides which locks tell a live worker from a dead one."""
    if routine not in ROUTINES:
        raise ConfigurationError(
            f"unknown maintenance routine {routine!r}: choose purge, rescue or renotify"
        )
    engine = context.create_engine(execution_options={dialects.WRITE_INTENT: True})
    claim = None
    try:
        # The worker's start-up checks: a missing or outdated schema says "run dbqueue migrate".
        claim = context.open_strategy(context.check_database(engine))
        name = f"{socket.gethostname()}:{os.getpid()}:manual"
        maintenance = Maintenance(
            context,
            engine,
            claim,
            context.notifier(claim, engine),
            context.maintenance_settings,
            name,
        )
        return maintenance.run_now(routine)
    finally:
        if claim is not None:
            claim.close()
        engine.dispose()


def _first_line(exc: BaseException | None) -> str:
    text = str(exc).strip() if exc is not None else ""
    return text.splitlines()[0] if text else type(exc).__name__

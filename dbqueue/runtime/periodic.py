"""Enqueueing the periodic ticks due now, exactly once whatever the number of workers checking.

Exactly once: a tick's job is inserted in the same transaction as the tick's row in
``<jobs>_periodic``, whose primary key is (schedule name, tick). The row goes in first, with an
INSERT that does nothing when the key exists (``Dialect.insert_unless_present``): the one worker
whose row goes in inserts the job and commits both; every other worker meeting the same tick
inserts nothing, raises nothing and enqueues nothing. A worker killed in between commits
neither, and the tick stays due for the others.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dbqueue import dialects
from dbqueue.errors import DbqueueError
from dbqueue.runtime.enqueue import job_for_task
from dbqueue.tasks.schedules import Schedule

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext

log = logging.getLogger("dbqueue.periodic")


#: A deadlock or lock timeout while claiming a tick: try the tick's transaction again.
TRANSIENT_RETRIES = 3


#: Told of each job a check enqueued, once committed: (its queue, its id).
Enqueued = Callable[[str, int], None]


@dataclasses.dataclass(frozen=True)
class TickOutcome:
    """What one check did about one due tick: the job it enqueued, or None when another
    worker's transaction had the tick."""

    schedule: str
    tick: dt.datetime
    job_id: int | None


# ---- the check ----------------------------------------------------------------------------------
def enqueue_tick(
    context: RuntimeContext, conn: Connection, schedule: Schedule, tick: dt.datetime
) -> int | None:
    """In ``conn``'s transaction: the tick's row, then its job (run_at = the tick), then the
    job's id on the row. None, having written nothing, when the tick's row exists."""
    engine = context.queue_engine(conn)
    if not engine.periodic.claim_periodic_tick(conn, schedule.name, tick):
        return None
    options = {**schedule.options, "run_at": tick}
    job_id = engine.inserts.insert(
        conn, job_for_task(context, schedule.task, schedule.payload, options)
    )
    engine.periodic.link_periodic_job(conn, schedule.name, tick, job_id)
    return job_id


def enqueue_due(
    context: RuntimeContext,
    engine: Engine,
    schedules: Sequence[Schedule],
    now: dt.datetime,
    enqueued: Enqueued | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> list[TickOutcome]:
    """Read each schedule's last recorded tick (one query), then enqueue its due ticks, oldest
    first, one transaction each. A schedule stops at its first failed tick (the exception
    propagates after the other schedules' ticks): a later tick is never recorded before an
    earlier one that is still due. ``stopping()`` true ends the check between two ticks (a
    worker told to stop does not go on catching up)."""
    if not schedules:
        return []
    reader = engine.execution_options(**{dialects.WRITE_INTENT: False})  # SQLite: no write lock
    with reader.connect() as conn:
        last = context.queue_engine(conn).periodic.last_periodic_ticks(
            conn, [s.name for s in schedules]
        )
    outcomes: list[TickOutcome] = []
    failure: BaseException | None = None
    for schedule in schedules:
        due = schedule.due(last.get(schedule.name), now)
        if not due:
            log.debug(
                "periodic %s: nothing due (last tick %s)", schedule.name, last.get(schedule.name)
            )
        elif len(due) > 1:
            log.info("periodic %s: catching up %d missed tick(s)", schedule.name, len(due))
        for tick in due:
            if stopping():
                return outcomes
            try:
                job_id = _enqueue_with_retries(context, engine, schedule, tick)
            except (sa.exc.DBAPIError, DbqueueError) as exc:
                failure = failure or exc
                break
            outcomes.append(TickOutcome(schedule.name, tick, job_id))
            _log_outcome(schedule, tick, job_id)
            if job_id is not None and enqueued is not None:
                enqueued(queue_of(context, schedule), job_id)
    if failure is not None:
        raise failure
    return outcomes


def _enqueue_with_retries(
    context: RuntimeContext, engine: Engine, schedule: Schedule, tick: dt.datetime
) -> int | None:
    dialect = dialects.for_sqlalchemy(engine.dialect)
    for attempt in range(1, TRANSIENT_RETRIES + 1):
        try:
            with engine.begin() as conn:
                return enqueue_tick(context, conn, schedule, tick)
        except sa.exc.DBAPIError as exc:
            # MySQL: workers inserting one key may deadlock on its gap locks; one of them is
            # rolled back, and its next try finds the winner's row.
            if attempt == TRANSIENT_RETRIES or not dialect.is_transient(exc):
                raise
            log.debug("periodic %s: tick %s retried after %s", schedule.name, tick, exc.orig)
            time.sleep(0.02 * attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def queue_of(context: RuntimeContext, schedule: Schedule) -> str:
    """Where the schedule's jobs go: its own queue, else its task's, else the App's default."""
    definition = context.registry.get(schedule.task)
    queue = schedule.options.get("queue") or (definition and definition.queue)
    return str(queue or context.default_queue)


def _log_outcome(schedule: Schedule, tick: dt.datetime, job_id: int | None) -> None:
    when = tick.isoformat(timespec="milliseconds")
    if job_id is None:
        log.debug("periodic %s: tick %s was enqueued by another worker", schedule.name, when)
    else:
        log.debug("periodic %s: tick %s enqueued job %d", schedule.name, when, job_id)

"""Periodic jobs on an App: ``@app.periodic`` / ``app.schedule`` (a part of the facade), and the
check that enqueues the ticks due now, exactly once whatever the number of workers making it.

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
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from typing_extensions import Unpack

from . import dialects
from . import payload as payload_codec
from .client import build_job, job_for_task, write_target
from .errors import DbqueueError
from .identifiers import check_task_name
from .migrate import check_schema
from .periodic import (
    UTC,
    PendingSchedule,
    Schedule,
    check_catch_up,
    check_schedule_name,
    parse_rule,
)
from .schema import DEFAULT_PRIORITY
from .tasks import Handler

if TYPE_CHECKING:
    from .client import Target
    from .runtime import RuntimeContext

log = logging.getLogger("dbqueue.periodic")

H = TypeVar("H", bound=Handler)
#: A deadlock or lock timeout while claiming a tick: try the tick's transaction again.
TRANSIENT_RETRIES = 3
#: Told of each job a check enqueued, once committed: (its queue, its id).
Enqueued = Callable[[str, int], None]


class ScheduleOptions(TypedDict, total=False):
    """Enqueue options of a schedule's jobs (``run_at`` is the tick itself; no ``delay``)."""

    queue: str | None
    priority: int | None
    max_attempts: int | None
    external_key: str | None
    origin: str | None
    destination: str | None
    tenant: int | None
    business_group: str | None


@dataclasses.dataclass(frozen=True)
class TickOutcome:
    """What one check did about one due tick: the job it enqueued, or None when another
    worker's transaction had the tick."""

    schedule: str
    tick: dt.datetime
    job_id: int | None


class PeriodicRegistration:
    """``@app.periodic`` and ``app.schedule``; the schedules land in the registry's schedule
    book, which the workers read."""

    context: RuntimeContext

    if TYPE_CHECKING:  # the App's (EagerMode): wake the workers, or run the jobs in eager mode

        def _enqueued(
            self, target: Target | None, queues: Sequence[str], ids: Sequence[int]
        ) -> None: ...

    def periodic(
        self,
        cron: str | None = None,
        *,
        name: str | None = None,
        every: float | dt.timedelta | None = None,
        payload: Any = None,
        tz: str | dt.tzinfo | None = None,
        catch_up: str = "none",
        **options: Unpack[ScheduleOptions],
    ) -> Callable[[H], H]:
        """Enqueue the decorated task on a schedule: ``cron`` (5 fields, or 6 with leading
        seconds, read in ``tz``, default UTC) or ``every`` seconds. Stack it on ``@app.task``,
        in either order. ``name`` (default: the task's name) keys the schedule's ticks in the
        table. ``catch_up``: what to do about ticks missed while no worker ran — "none" (skip
        them), "latest" (enqueue the most recent one), "all" (every one, at most 1,000). The
        options (queue, priority, max_attempts, …) apply to every job it enqueues."""
        what = f"@app.periodic(name={name!r})" if name is not None else "@app.periodic"
        pending = _pending(self.context, what, name, None, cron, every, tz, catch_up, payload)
        checked = _checked_options(self.context, what, pending.payload, options)

        def register(handler: H) -> H:
            definitions = self.context.registry
            task = next(
                (
                    n
                    for n in definitions.names()
                    if getattr(definitions.get(n), "handler", None) is handler
                ),
                None,
            )
            named = pending.name or task  # known now unless @app.task comes after
            self.context.registry.schedules.add(
                dataclasses.replace(
                    pending, name=named, task=task, handler=handler, options=checked
                )
            )
            return handler

        return register

    def schedule(
        self,
        cron: str | None = None,
        *,
        task: str,
        name: str | None = None,
        every: float | dt.timedelta | None = None,
        payload: Any = None,
        tz: str | dt.tzinfo | None = None,
        catch_up: str = "none",
        **options: Unpack[ScheduleOptions],
    ) -> Schedule:
        """Enqueue ``task`` (registered here, in another module, or only in other workers) on
        a schedule; the arguments are ``periodic``'s. Returns the schedule."""
        check_task_name(task)
        name = task if name is None else name
        what = f"app.schedule(name={name!r})"
        pending = _pending(self.context, what, name, task, cron, every, tz, catch_up, payload)
        checked = _checked_options(self.context, what, pending.payload, options)
        pending = dataclasses.replace(pending, options=checked)
        self.context.registry.schedules.add(pending)
        return Schedule(name, task, pending.rule, pending.payload, checked, pending.catch_up)

    def schedules(self) -> list[Schedule]:
        """Every schedule declared on this App, by name (each with its task resolved)."""
        return self.context.registry.schedules.resolved(self.context.registry)

    def enqueue_periodic(self, now: dt.datetime | None = None) -> list[TickOutcome]:
        """Enqueue the ticks due at ``now`` (default: the time now), as each worker's scheduler
        does (``catch_up`` applies); returns what was done about each due tick. In eager mode
        each job then runs here, like any enqueue's."""
        engine = write_target(self.context.engine)
        assert isinstance(engine, Engine)
        when = dt.datetime.now(UTC) if now is None else now.astimezone(UTC)
        return enqueue_due(
            self.context,
            engine,
            self.schedules(),
            when,
            lambda queue, job_id: self._enqueued(None, [queue], [job_id]),
        )

    def periodic_status(self) -> list[dict[str, Any]]:
        """One dict per schedule — name, cron, tz, task, queue, catch_up, last_tick,
        next_tick, last_job_id, last_job_status, ticks (rows kept) — then the schedule names
        the table holds that this App does not declare (with ``declared`` False)."""
        schedules = self.schedules()
        with self.context.engine.connect() as conn:
            check_schema(conn, self.context.names)
            found = {r["name"]: r for r in self.context.queue_engine(conn).periodic_status(conn)}
        now = dt.datetime.now(UTC)
        rows = [
            {**_describe(self.context, s, now), **_recorded(found.pop(s.name, None))}
            for s in schedules
        ]
        for name in sorted(found):
            rows.append({**_undeclared(name), **_recorded(found[name])})
        return rows


def _pending(
    context: RuntimeContext,
    what: str,
    name: str | None,
    task: str | None,
    cron: str | None,
    every: Any,
    tz: Any,
    catch_up: str,
    payload: Any,
) -> PendingSchedule:
    if name is not None:
        check_schedule_name(name)
    rule = parse_rule(cron, every, tz, what)
    try:
        encoded = payload_codec.encode(payload, context.max_payload_bytes)
    except DbqueueError as exc:
        raise type(exc)(f"{what}: {exc}") from None
    return PendingSchedule(name, task, None, rule, encoded, {}, check_catch_up(catch_up, what))


def _checked_options(
    context: RuntimeContext, what: str, payload: Any, options: Mapping[str, Any]
) -> dict[str, Any]:
    """The options, validated now as an enqueue would (one line naming the schedule)."""
    unknown = sorted(set(options) - set(ScheduleOptions.__annotations__))
    if unknown:
        raise TypeError(
            f"{what} got unexpected keyword argument(s) {', '.join(map(repr, unknown))}: the "
            f"options are {', '.join(sorted(ScheduleOptions.__annotations__))}"
        )
    given = {k: v for k, v in options.items() if v is not None}
    try:
        build_job(
            "periodic",
            payload,
            queue=given.get("queue", context.default_queue),
            priority=given.get("priority", DEFAULT_PRIORITY),
            max_attempts=given.get("max_attempts", 1),
            max_payload_bytes=None,
            **{k: v for k, v in given.items() if k not in ("queue", "priority", "max_attempts")},
        )
    except DbqueueError as exc:
        raise type(exc)(f"{what}: {exc}") from None
    return given


def _describe(context: RuntimeContext, schedule: Schedule, now: dt.datetime) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "cron": schedule.cron,
        "tz": schedule.tz,
        "task": schedule.task,
        "queue": _queue_of(context, schedule),
        "catch_up": schedule.catch_up,
        "next_tick": schedule.next_after(now),
        "declared": True,
    }


def _undeclared(name: str) -> dict[str, Any]:
    return dict.fromkeys(("cron", "tz", "task", "queue", "catch_up", "next_tick")) | {
        "name": name,
        "declared": False,
    }


def _recorded(row: Mapping[str, Any] | None) -> dict[str, Any]:
    keys = ("last_tick", "last_job_id", "last_job_status")
    return {key: (row or {}).get(key) for key in keys} | {"ticks": (row or {}).get("ticks", 0)}


# ---- the check ----------------------------------------------------------------------------------
def enqueue_tick(
    context: RuntimeContext, conn: Connection, schedule: Schedule, tick: dt.datetime
) -> int | None:
    """In ``conn``'s transaction: the tick's row, then its job (run_at = the tick), then the
    job's id on the row. None, having written nothing, when the tick's row exists."""
    engine = context.queue_engine(conn)
    if not engine.claim_periodic_tick(conn, schedule.name, tick):
        return None
    options = {**schedule.options, "run_at": tick}
    job_id = engine.insert(conn, job_for_task(context, schedule.task, schedule.payload, options))
    engine.link_periodic_job(conn, schedule.name, tick, job_id)
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
        last = context.queue_engine(conn).last_periodic_ticks(conn, [s.name for s in schedules])
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
                enqueued(_queue_of(context, schedule), job_id)
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


def _queue_of(context: RuntimeContext, schedule: Schedule) -> str:
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

"""Periodic jobs on an App: ``@app.periodic`` / ``app.schedule``, and a check made by hand
(``app.enqueue_periodic``); the workers' check is ``runtime/periodic.py``."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from sqlalchemy.engine import Engine

from dbqueue.base import payload as payload_codec
from dbqueue.base.identifiers import check_task_name
from dbqueue.errors import DbqueueError
from dbqueue.runtime.enqueue import build_job
from dbqueue.runtime.periodic import TickOutcome, enqueue_due, queue_of
from dbqueue.runtime.targets import write_target
from dbqueue.schema.tables import DEFAULT_PRIORITY
from dbqueue.tasks.registry import Handler
from dbqueue.tasks.schedules import (
    UTC,
    PendingSchedule,
    Schedule,
    check_catch_up,
    check_schedule_name,
    parse_rule,
)

if TYPE_CHECKING:
    from dbqueue.app.eager import AfterCommit
    from dbqueue.runtime.context import RuntimeContext

log = logging.getLogger("dbqueue.periodic")

H = TypeVar("H", bound=Handler)


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


class PeriodicSchedules:
    """``@app.periodic`` and ``app.schedule``; the schedules land in the registry's schedule
    book, which the workers read. ``after_commit`` follows a tick's job as any enqueue's."""

    def __init__(self, context: RuntimeContext, after_commit: AfterCommit) -> None:
        self.context = context
        self._after_commit = after_commit

    def periodic(
        self,
        cron: str | None,
        name: str | None,
        every: float | dt.timedelta | None,
        payload: Any,
        tz: str | dt.tzinfo | None,
        catch_up: str,
        options: Mapping[str, Any],
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
        cron: str | None,
        task: str,
        name: str | None,
        every: float | dt.timedelta | None,
        payload: Any,
        tz: str | dt.tzinfo | None,
        catch_up: str,
        options: Mapping[str, Any],
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
            lambda queue, job_id: self._after_commit.enqueued(None, [queue], [job_id]),
        )

    def periodic_status(self) -> list[dict[str, Any]]:
        """One dict per schedule — name, cron, tz, task, queue, catch_up, last_tick,
        next_tick, last_job_id, last_job_status, ticks (rows kept) — then the schedule names
        the table holds that this App does not declare (with ``declared`` False)."""
        from dbqueue.migrations.migrate import check_schema  # Alembic: loaded when first used

        schedules = self.schedules()
        with self.context.engine.connect() as conn:
            check_schema(conn, self.context.names)
            found = {
                r["name"]: r for r in self.context.queue_engine(conn).periodic.periodic_status(conn)
            }
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
        "queue": queue_of(context, schedule),
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

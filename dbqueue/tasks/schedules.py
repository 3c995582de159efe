"""Periodic schedules: when their ticks fall, and which ticks are due now.

A schedule's ticks come from a cron expression read in its time zone (cronsim: Debian cron's
rules, including its behaviour when daylight saving time starts and ends) or from ``every=``
seconds counted from the Unix epoch. Ticks are instants, always handled here as aware UTC
datetimes, so that every worker computes the very same tick values: the primary key of the
``<jobs>_periodic`` table is (schedule name, tick), and a second worker meeting the same tick
finds its row instead of enqueueing the job again (see ``dbqueue.runtime.periodic``).

Nothing here touches the database: this module only answers "what is due, given the last tick
recorded and the time now" and "when is the next tick".
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from dbqueue.errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable

UTC = dt.timezone.utc

#: What a schedule does about ticks that passed while no worker ran (see ``due_ticks``).
CATCH_UP_MODES = ("none", "latest", "all")
#: How old the current tick may be and still count as "now" (catch_up="none", and a schedule's
#: first tick ever): a worker that wakes a little late, or starts just after a tick, still
#: enqueues it.
GRACE_SECONDS = 10.0
#: The most ticks one check enqueues for catch_up="all": the most recent ones (a minutely
#: schedule stopped for a day would otherwise enqueue 1,440 jobs at once).
MAX_CATCH_UP = 1000
#: The shortest ``every=``.
MIN_EVERY_SECONDS = 0.1
MAX_NAME_LENGTH = 200

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_NAME = re.compile(r"[^\x00-\x1f\x7f]+\Z")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = dt.timedelta(microseconds=1)
#: Longest look-back when searching for past ticks (cronsim gives up after 50 years too).
_MAX_SPAN = dt.timedelta(days=366 * 50)


class Rule(Protocol):
    """When a schedule's ticks fall (every tick an aware UTC datetime)."""

    def next_after(self, when: dt.datetime) -> dt.datetime | None:
        """The first tick strictly after ``when``."""

    def ticks_in(
        self, after: dt.datetime | None, until: dt.datetime, limit: int
    ) -> list[dt.datetime]:
        """The latest ``limit`` ticks in (after, until], oldest first (after None: any)."""

    def describe(self) -> str: ...

    @property
    def tz(self) -> str: ...


@dataclass(frozen=True)
class CronRule:
    """A cron expression: 5 fields (minute hour day month weekday), or 6 with a leading
    seconds field; ``@hourly``, ``@daily``… stand for their expressions."""

    expression: str
    zone: dt.tzinfo
    zone_name: str

    def _iterate(self, after: dt.datetime) -> Iterator[dt.datetime]:
        """Ticks strictly after ``after``, in UTC, increasing. cronsim reads specific local
        times (e.g. ``30 2 * * *``) as naive wall-clock times, which during the repeated hour
        of a DST change can land before the start: those are dropped."""
        expanded = _MACROS.get(self.expression.lower(), self.expression)
        last = after
        for local in CronSim(expanded, after.astimezone(self.zone)):
            tick = local.astimezone(UTC)
            if tick > last:
                last = tick
                yield tick

    def next_after(self, when: dt.datetime) -> dt.datetime | None:
        return next(self._iterate(when), None)

    def ticks_in(
        self, after: dt.datetime | None, until: dt.datetime, limit: int
    ) -> list[dt.datetime]:
        # Forward iteration only (cronsim's primary path), over a window ending at ``until``
        # that grows fourfold until it holds ``limit`` ticks or reaches ``after``: a window is
        # only widened when the one before it held fewer than ``limit`` ticks.
        span = dt.timedelta(seconds=1 if len(self.expression.split()) == 6 else 60)
        while True:
            start = until - span
            if after is not None and start <= after:
                start = after
            ticks: list[dt.datetime] = []
            for tick in self._iterate(start):
                if tick > until:
                    break
                ticks.append(tick)
            if len(ticks) >= limit or start == after or span > _MAX_SPAN:
                return ticks[-limit:]
            span *= 4

    def describe(self) -> str:
        return self.expression

    @property
    def tz(self) -> str:
        return self.zone_name


@dataclass(frozen=True)
class IntervalRule:
    """``every=`` seconds: ticks at whole multiples of the interval since the Unix epoch (UTC),
    so every process agrees on them (``every=300``: :00, :05, :10 …)."""

    micros: int

    def _tick(self, index: int) -> dt.datetime:
        return _EPOCH + dt.timedelta(microseconds=index * self.micros)

    def _index_at_or_before(self, when: dt.datetime) -> int:
        elapsed = when - _EPOCH
        micros = (elapsed.days * 86400 + elapsed.seconds) * 1_000_000 + elapsed.microseconds
        return micros // self.micros

    def next_after(self, when: dt.datetime) -> dt.datetime | None:
        return self._tick(self._index_at_or_before(when) + 1)

    def ticks_in(
        self, after: dt.datetime | None, until: dt.datetime, limit: int
    ) -> list[dt.datetime]:
        last = self._index_at_or_before(until)
        first = last - limit + 1
        if after is not None:
            first = max(first, self._index_at_or_before(after) + 1)
        return [self._tick(index) for index in range(first, last + 1)]

    def describe(self) -> str:
        return f"every {self.micros / 1_000_000:g}s"

    @property
    def tz(self) -> str:
        return "UTC"


def parse_rule(cron: str | None, every: Any, tz: Any, what: str) -> Rule:
    """The rule of a schedule: a cron expression in a time zone, or an interval; one clear line
    naming the mistake otherwise."""
    if (cron is None) == (every is None):
        raise ConfigurationError(
            f"{what}: give either a cron expression (e.g. '*/5 * * * *') or every=SECONDS, "
            "not both and not neither"
        )
    if every is not None:
        if tz is not None and _zone_name(tz) != "UTC":
            raise ConfigurationError(
                f"{what}: tz={tz!r} applies to cron expressions only; every= ticks are counted "
                "from the Unix epoch in UTC (use a cron expression for local times)"
            )
        return IntervalRule(_interval_micros(every, what))
    if not isinstance(cron, str) or not cron.strip():
        raise ConfigurationError(f"{what}: the cron expression must be a non-empty string")
    zone, zone_name = _zone(tz, what)
    expression = " ".join(cron.split())
    rule = CronRule(expression, zone, zone_name)
    try:
        rule.next_after(dt.datetime.now(UTC))
    except CronSimError as exc:
        raise ConfigurationError(
            f"{what}: bad cron expression {cron!r} ({exc}): use 5 fields, minute hour "
            "day-of-month month day-of-week (e.g. '*/5 * * * *' or '0 3 * * MON'), 6 with a "
            "leading seconds field, or @hourly/@daily/@weekly/@monthly/@yearly"
        ) from None
    return rule


def _interval_micros(every: Any, what: str) -> int:
    seconds = every.total_seconds() if isinstance(every, dt.timedelta) else every
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds < MIN_EVERY_SECONDS
    ):
        raise ConfigurationError(
            f"{what}: every={every!r} must be a number of seconds (or a timedelta) of at least "
            f"{MIN_EVERY_SECONDS:g}"
        )
    return round(seconds * 1_000_000)


def _zone_name(tz: Any) -> str:
    return str(getattr(tz, "key", None) or tz)


def _zone(tz: Any, what: str) -> tuple[dt.tzinfo, str]:
    if tz is None or tz == "UTC":
        return UTC, "UTC"
    if isinstance(tz, dt.tzinfo):
        return tz, _zone_name(tz)
    if isinstance(tz, str):
        try:
            return ZoneInfo(tz), tz
        except (ZoneInfoNotFoundError, ValueError):
            pass
    raise ConfigurationError(
        f"{what}: unknown time zone tz={tz!r}: use an IANA name such as 'UTC', "
        "'Europe/Berlin' or 'America/Sao_Paulo'"
    )


def check_catch_up(catch_up: Any, what: str) -> str:
    if catch_up not in CATCH_UP_MODES:
        raise ConfigurationError(
            f"{what}: catch_up={catch_up!r} must be 'none' (only the current tick), 'latest' "
            "(the most recent missed tick) or 'all' (every missed tick)"
        )
    return str(catch_up)


def check_schedule_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name) or len(name) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"schedule name {name!r} is not allowed: use 1-{MAX_NAME_LENGTH} printable "
            "characters (e.g. 'hourly_report')"
        )
    return name


def due_ticks(
    rule: Rule,
    catch_up: str,
    last: dt.datetime | None,
    now: dt.datetime,
    grace: float = GRACE_SECONDS,
    limit: int = MAX_CATCH_UP,
) -> list[dt.datetime]:
    """The ticks to enqueue now, oldest first, given the last tick recorded (None: none yet).

    - The *current* tick is the latest tick at or before ``now``; it is *fresh* while it is at
      most ``grace`` seconds old. A tick at or before ``last`` is never due again.
    - No tick recorded yet (a new schedule): the current tick if fresh, else nothing — a first
      start never enqueues the past.
    - ``none``: the current tick if fresh; missed ticks are skipped.
    - ``latest``: the current tick, however old: the most recent of the missed ticks.
    - ``all``: every tick after ``last`` up to now; at most ``limit``, the most recent ones.
    """
    window = rule.ticks_in(last, now, limit if catch_up == "all" and last is not None else 1)
    if not window:
        return []
    current = window[-1]
    fresh = (now - current).total_seconds() <= grace
    if last is None or catch_up == "none":
        return [current] if fresh else []
    if catch_up == "latest":
        return [current]
    return window


@dataclass(frozen=True)
class Schedule:
    """A periodic schedule, resolved: its name (the key of its ticks in the table), the task
    its jobs run, when its ticks fall, the payload and enqueue options of each job."""

    name: str
    task: str
    rule: Rule
    payload: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)
    catch_up: str = "none"

    @property
    def cron(self) -> str:
        """The cron expression, or ``every Ns`` for an interval."""
        return self.rule.describe()

    @property
    def tz(self) -> str:
        return self.rule.tz

    def due(self, last: dt.datetime | None, now: dt.datetime) -> list[dt.datetime]:
        return due_ticks(self.rule, self.catch_up, last, now)

    def next_after(self, when: dt.datetime) -> dt.datetime | None:
        return self.rule.next_after(when)


@dataclass(frozen=True)
class PendingSchedule:
    """A schedule as declared: its task (and name) may still be unknown when ``@app.periodic``
    sits below ``@app.task`` (the function is registered as a task only afterwards)."""

    name: str | None
    task: str | None
    handler: Callable[..., Any] | None
    rule: Rule
    payload: Any
    options: Mapping[str, Any]
    catch_up: str


class TaskNames(Protocol):
    """What resolving a schedule needs from the task registry."""

    def names(self) -> list[str]: ...

    def get(self, name: str) -> Any: ...


class ScheduleBook:
    """The schedules declared on one App (shared by every reconfigured copy of it). Schedules
    live in code: the table only remembers ticks, so a changed schedule needs no migration."""

    def __init__(self) -> None:
        self._pending: list[PendingSchedule] = []

    def add(self, pending: PendingSchedule) -> None:
        known = [p.name for p in self._pending if p.name is not None]
        if pending.name is not None and pending.name in known:
            raise ConfigurationError(
                f"schedule {pending.name!r} is declared twice: give each schedule its own name="
            )
        self._pending.append(pending)

    def __len__(self) -> int:
        return len(self._pending)

    def resolved(self, registry: TaskNames) -> list[Schedule]:
        """Every schedule with its task and name known, by name; ConfigurationError naming the
        fix for a function never registered as a task, or two schedules of one name."""
        found: dict[str, Schedule] = {}
        for pending in self._pending:
            task = pending.task or _task_of(pending.handler, registry)
            name = pending.name or task
            if name in found:
                raise ConfigurationError(
                    f"two schedules are named {name!r}: give one of them another name="
                )
            found[name] = Schedule(
                name, task, pending.rule, pending.payload, pending.options, pending.catch_up
            )
        return [found[name] for name in sorted(found)]


def _task_of(handler: Callable[..., Any] | None, registry: TaskNames) -> str:
    names = [n for n in registry.names() if getattr(registry.get(n), "handler", None) is handler]
    described = getattr(handler, "__qualname__", repr(handler))
    if not names:
        raise ConfigurationError(
            f"@app.periodic on {described}: the function is not registered as a task; stack "
            "it with @app.task(...) (in either order), or use app.schedule(..., task=NAME)"
        )
    if len(names) > 1:
        raise ConfigurationError(
            f"@app.periodic on {described}: the function is registered as several tasks "
            f"({', '.join(names)}); use app.schedule(..., task=NAME) for each instead"
        )
    return names[0]

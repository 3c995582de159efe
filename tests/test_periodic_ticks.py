"""Periodic schedules without a database: tick computation (intervals, cron in UTC and in a time
zone across DST changes), which ticks each catch_up mode makes due, and bad declarations
refused in one line. The database side is in tests/contract/test_periodic.py."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

import dbqueue
from dbqueue.tasks.schedules import GRACE_SECONDS, due_ticks, parse_rule

UTC = dt.timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")


def utc(*parts: int) -> dt.datetime:
    return dt.datetime(*parts, tzinfo=UTC)


def forward(rule, start: dt.datetime, until: dt.datetime) -> list[dt.datetime]:
    """Every tick in (start, until], one next_after at a time."""
    ticks, tick = [], rule.next_after(start)
    while tick is not None and tick <= until:
        ticks.append(tick)
        tick = rule.next_after(tick)
    return ticks


def app() -> dbqueue.App:
    return dbqueue.App("sqlite:///never-opened.db")  # creating an App never connects


# ---- ticks --------------------------------------------------------------------------------------
def test_every_ticks_at_whole_multiples_of_the_interval_since_the_epoch():
    rule = parse_rule(None, 0.25, None, "t")
    assert rule.next_after(utc(2030, 1, 1, 0, 0, 0, 100_000)) == utc(2030, 1, 1, 0, 0, 0, 250_000)
    assert rule.next_after(utc(2030, 1, 1, 0, 0, 0, 250_000)) == utc(2030, 1, 1, 0, 0, 0, 500_000)
    quarter = [utc(2030, 1, 1, 0, 0, 0, us) for us in (250_000, 500_000, 750_000)]
    assert rule.ticks_in(utc(2030, 1, 1), utc(2030, 1, 1, 0, 0, 1), 10) == [
        *quarter,
        utc(2030, 1, 1, 0, 0, 1),
    ]
    assert rule.ticks_in(None, utc(2030, 1, 1, 0, 0, 0, 800_000), 2) == quarter[1:]
    five = parse_rule(None, dt.timedelta(minutes=5), "UTC", "t")
    assert five.next_after(utc(2030, 1, 1, 12, 3, 59)) == utc(2030, 1, 1, 12, 5)
    assert five.describe() == "every 300s" and five.tz == "UTC"


def test_cron_ticks_in_utc_and_in_a_time_zone():
    every_5 = parse_rule("*/5 * * * *", None, None, "t")
    assert forward(every_5, utc(2030, 1, 1, 12, 0), utc(2030, 1, 1, 12, 15)) == [
        utc(2030, 1, 1, 12, 5),
        utc(2030, 1, 1, 12, 10),
        utc(2030, 1, 1, 12, 15),
    ]
    nightly = parse_rule("0 3 * * *", None, "Europe/Berlin", "t")
    assert nightly.next_after(utc(2030, 1, 1)) == utc(2030, 1, 1, 2)  # CET: UTC+1
    assert nightly.next_after(utc(2030, 7, 1)) == utc(2030, 7, 1, 1)  # CEST: UTC+2
    assert nightly.tz == "Europe/Berlin"
    seconds = parse_rule("*/15 * * * * *", None, None, "t")  # 6 fields: seconds first
    assert seconds.ticks_in(None, utc(2030, 1, 1, 0, 1), 3) == [
        utc(2030, 1, 1, 0, 0, 30),
        utc(2030, 1, 1, 0, 0, 45),
        utc(2030, 1, 1, 0, 1),
    ]
    hourly = parse_rule("@hourly", None, None, "t")
    assert hourly.next_after(utc(2030, 1, 1, 12, 0, 1)) == utc(2030, 1, 1, 13)


def test_dst_in_berlin_a_daily_time_runs_once_and_hours_follow_the_clock():
    daily = parse_rule("30 2 * * *", None, BERLIN, "t")
    # Spring forward (31 March 2024, 02:00 → 03:00): 02:30 does not exist; like Debian's cron
    # the job runs right after the jump, at 03:00 CEST.
    assert forward(daily, utc(2024, 3, 29), utc(2024, 4, 1, 12)) == [
        utc(2024, 3, 29, 1, 30),
        utc(2024, 3, 30, 1, 30),
        utc(2024, 3, 31, 1, 0),
        utc(2024, 4, 1, 0, 30),
    ]
    # Fall back (27 October 2024, 03:00 → 02:00): 02:30 happens twice; the job runs once.
    fall = [utc(2024, 10, 26, 0, 30), utc(2024, 10, 27, 0, 30), utc(2024, 10, 28, 1, 30)]
    assert forward(daily, utc(2024, 10, 26), utc(2024, 10, 28, 12)) == fall
    # The look-back agrees with the forward walk, even from inside the repeated hour.
    assert daily.ticks_in(None, utc(2024, 10, 28, 12), 3) == fall
    assert daily.ticks_in(None, utc(2024, 10, 27, 1, 10), 1) == [utc(2024, 10, 27, 0, 30)]
    hourly = parse_rule("0 * * * *", None, BERLIN, "t")
    local_days = {
        "spring": (utc(2024, 3, 30, 23), utc(2024, 3, 31, 22)),  # local midnight to midnight
        "fall": (utc(2024, 10, 26, 22), utc(2024, 10, 27, 23)),
    }
    lengths = {k: len(forward(hourly, a, b)) for k, (a, b) in local_days.items()}
    assert lengths == {"spring": 23, "fall": 25}
    # catch_up="all" across the repeated hour: both 02:00s are real instants, both are due.
    due = due_ticks(hourly, "all", utc(2024, 10, 27, 0), utc(2024, 10, 27, 2, 0, 5))
    assert due == [utc(2024, 10, 27, 1), utc(2024, 10, 27, 2)]


# ---- what is due ---------------------------------------------------------------------------------
MINUTE = parse_rule(None, 60, None, "t")
T0 = utc(2030, 1, 1, 12, 0)


def at(minutes: int, seconds: float = 0) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes, seconds=seconds)


@pytest.mark.parametrize(
    ("last", "now", "expected"),
    [
        # No tick recorded yet (first start): the current tick if fresh, never the past.
        (None, at(0, 2), {"none": [at(0)], "latest": [at(0)], "all": [at(0)]}),
        (None, at(0, 30), {"none": [], "latest": [], "all": []}),
        # Ticks 1…5 missed; the current one (5) is fresh.
        (
            at(0),
            at(5, 3),
            {"none": [at(5)], "latest": [at(5)], "all": [at(m) for m in range(1, 6)]},
        ),
        # Ticks 1…5 missed; the current one is 30 s old.
        (at(0), at(5, 30), {"none": [], "latest": [at(5)], "all": [at(m) for m in range(1, 6)]}),
        # The current tick is recorded: nothing is due twice.
        (at(5), at(5, 3), {"none": [], "latest": [], "all": []}),
        # Exactly GRACE_SECONDS old still counts as now.
        (at(4), at(5, GRACE_SECONDS), {"none": [at(5)], "latest": [at(5)], "all": [at(5)]}),
    ],
)
def test_due_ticks_follow_the_catch_up_mode(last, now, expected):
    assert {mode: due_ticks(MINUTE, mode, last, now) for mode in expected} == expected


def test_catch_up_all_is_capped_to_the_most_recent_ticks():
    assert due_ticks(MINUTE, "all", at(0), at(500), limit=3) == [at(498), at(499), at(500)]
    assert len(due_ticks(MINUTE, "all", at(0) - dt.timedelta(days=30), at(0))) == 1000
    daily = parse_rule("0 0 * * *", None, None, "t")
    assert due_ticks(daily, "all", utc(2020, 1, 1), utc(2020, 1, 4, 0, 0, 1)) == [
        utc(2020, 1, 2),
        utc(2020, 1, 3),
        utc(2020, 1, 4),
    ]


# ---- declarations --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("arguments", "error", "words"),
    [
        ({"cron": "61 * * * *"}, dbqueue.ConfigurationError, "bad cron expression '61 * * * *'"),
        ({"cron": "* * *"}, dbqueue.ConfigurationError, "bad cron expression"),
        ({"cron": "0 3 * * *", "tz": "Mars/Olympus"}, dbqueue.ConfigurationError, "time zone"),
        ({"cron": "0 3 * * *", "catch_up": "some"}, dbqueue.ConfigurationError, "catch_up"),
        ({"cron": "* * * * *", "every": 5}, dbqueue.ConfigurationError, "either a cron"),
        ({}, dbqueue.ConfigurationError, "either a cron"),
        ({"every": 0}, dbqueue.ConfigurationError, "every=0 must be"),
        ({"every": "5"}, dbqueue.ConfigurationError, "every='5' must be"),
        ({"every": 60, "tz": "Europe/Berlin"}, dbqueue.ConfigurationError, "cron expressions"),
        ({"every": 5, "payload": {"when": object()}}, dbqueue.PayloadError, "payload['when']"),
        ({"every": 5, "priority": "high"}, dbqueue.ConfigurationError, "priority='high'"),
        ({"every": 5, "queue": "bad queue!"}, dbqueue.UnsafeIdentifierError, "queue name"),
        ({"every": 5, "name": ""}, dbqueue.ConfigurationError, "schedule name ''"),
        ({"every": 5, "delay": 3}, TypeError, "'delay'"),
    ],
)
def test_a_bad_schedule_is_refused_in_one_line(arguments, error, words):
    for declare in (
        lambda: app().periodic(**arguments),
        lambda: app().schedule(task="report", **arguments),
    ):
        with pytest.raises(error) as raised:
            declare()
        message = str(raised.value)
        assert words in message and "\n" not in message, message


def test_periodic_stacks_on_task_in_either_order_and_is_named_after_it():
    queue_app = app()

    @queue_app.periodic("*/5 * * * *", catch_up="latest", priority=3)
    @queue_app.task("above", queue="reports")
    def above(job, session) -> None: ...

    @queue_app.task("below")
    @queue_app.periodic(every=30, name="half_minute", payload={"n": 1})
    def below(job, session) -> None: ...

    queue_app.schedule("0 3 * * *", task="elsewhere", tz="Europe/Berlin")
    found = {s.name: s for s in queue_app.reconfigured(queue="other").schedules()}
    assert sorted(found) == ["above", "elsewhere", "half_minute"]
    assert (found["above"].task, found["above"].catch_up) == ("above", "latest")
    assert dict(found["above"].options) == {"priority": 3}
    assert (found["half_minute"].task, found["half_minute"].cron) == ("below", "every 30s")
    assert found["half_minute"].payload == '{"n":1}'  # encoded once, when declared
    assert (found["elsewhere"].cron, found["elsewhere"].tz) == ("0 3 * * *", "Europe/Berlin")


def test_a_schedule_whose_function_is_no_task_or_whose_name_is_taken_is_refused():
    queue_app = app()

    @queue_app.periodic("*/5 * * * *")
    def orphan(job, session) -> None: ...

    with pytest.raises(dbqueue.ConfigurationError, match=r"not registered as a task; stack"):
        queue_app.schedules()

    taken = app()
    taken.schedule(every=60, task="report", name="report")
    with pytest.raises(dbqueue.ConfigurationError, match="declared twice"):
        taken.schedule("0 * * * *", task="other", name="report")
    handler = taken.task("report")(lambda job, session: None)
    with pytest.raises(dbqueue.ConfigurationError, match="declared twice"):
        taken.periodic(every=5)(handler)  # named after its task, known at once

    later = app()
    later.schedule(every=60, task="report", name="report")
    later.task("report")(later.periodic(every=5)(lambda job, session: None))  # name known later
    with pytest.raises(dbqueue.ConfigurationError, match="two schedules are named 'report'"):
        later.schedules()

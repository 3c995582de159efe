"""Periodic jobs on real databases: real worker processes enqueue each tick exactly once (also
while they are SIGKILLed and restarted), catch_up after downtime, a changed schedule, the purge
of old ticks, and `dbqueue periodic list`."""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa
from support.cli_runner import invoke
from support.waiting import wait_for

from dbqueue.runtime.periodic import enqueue_due
from dbqueue.runtime.targets import write_target

pytestmark = pytest.mark.slow

WORKER = Path(__file__).resolve().parents[1] / "support" / "periodic_worker.py"
UTC = dt.timezone.utc
#: The schedule of the process tests: 20 ticks pass in 2 seconds.
EVERY = 0.1
STEP = dt.timedelta(seconds=EVERY)
TICK_LINE = re.compile(r"pid=(\d+) DEBUG dbqueue\.periodic: periodic \S+: tick (\S+) enqueued job")


# ---- helpers ----------------------------------------------------------------------------------
#: (url, prefix) → an engine and the periodic table: the tests poll the table often.
_OPEN: dict[tuple[str, str], tuple[sa.Engine, sa.Table]] = {}


@pytest.fixture(autouse=True, scope="module")
def _dispose_engines():
    yield
    for engine, _ in _OPEN.values():
        engine.dispose()
    _OPEN.clear()


def periodic_table(backend) -> tuple[sa.Engine, sa.Table]:
    key = (backend.url, backend.prefix)
    if key not in _OPEN:
        _OPEN[key] = (backend.engine(), backend.app().tables.periodic)
    return _OPEN[key]


def clear_ticks(backend) -> None:
    engine, table = periodic_table(backend)
    with engine.begin() as conn:
        conn.execute(sa.delete(table))


def tick_rows(backend, name: str) -> list[tuple[dt.datetime, int | None]]:
    """(tick, job_id) of every recorded tick of schedule ``name``, oldest first."""
    engine, p = periodic_table(backend)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(p.c.tick, p.c.job_id).where(p.c.name == name).order_by(p.c.tick)
        )
        return [(tick, job_id) for tick, job_id in rows]


def last_tick(backend, name: str) -> dt.datetime | None:
    rows = tick_rows(backend, name)
    return rows[-1][0] if rows else None


def start_worker(backend, name: str, log: Path, *options: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            backend.url,
            backend.strategy,
            *backend.worker_args(),
            "--name",
            name,
            "--every",
            str(EVERY),
            *options,
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def started(log: Path, name: str) -> int:
    """How many worker processes have started their scheduler."""
    return log.read_text().count(f"periodic: {name} (every {EVERY:g}s)")


def stop_all(workers: list[subprocess.Popen]) -> list[int]:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    return [worker.wait(timeout=60) for worker in workers]


def logged_ticks(log: Path) -> list[tuple[int, dt.datetime]]:
    """(pid, tick) of each "tick … enqueued job" line the workers logged."""
    return [
        (int(pid), dt.datetime.fromisoformat(tick))
        for pid, tick in TICK_LINE.findall(log.read_text())
    ]


def assert_each_tick_once(backend, name: str) -> list[tuple[dt.datetime, int | None]]:
    """No tick missing between the first and the last, one job per tick and no other, each
    job's run_at its tick."""
    rows = tick_rows(backend, name)
    gaps = [b - a for (a, _), (b, _) in zip(rows, rows[1:], strict=False) if b - a != STEP]
    assert not gaps, f"ticks are not {EVERY}s apart: {gaps[:5]}"
    ids = [job_id for _, job_id in rows]
    assert None not in ids and len(set(ids)) == len(ids), ids
    jobs = {j["id"]: j for j in backend.jobs() if j["task"] == "per_tick"}
    assert sorted(jobs) == sorted(ids)  # no job without its tick, no tick without its job
    for tick, job_id in rows:
        assert jobs[job_id]["run_at"] == tick
        assert jobs[job_id]["payload"] == {"from": "schedule"}
    return rows


# ---- worker processes -------------------------------------------------------------------------
def count_after(backend, name: str, first: dt.datetime) -> int:
    return sum(tick > first for tick, _ in tick_rows(backend, name))


def kill_and_replace(backend, workers, index, spare, go: Path, name, log) -> None:
    """Right after the next tick is recorded: SIGKILL ``workers[index]``, and start ``spare``
    (a process that has done its imports and waits for ``go``) in its place."""
    seen = last_tick(backend, name)
    wait_for(lambda: last_tick(backend, name) != seen, 30, "the next tick", log)
    victim = workers[index]
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=10) == -signal.SIGKILL
    go.touch()
    workers[index] = spare


def test_worker_processes_enqueue_each_tick_exactly_once_even_when_sigkilled(backend, tmp_path):
    """Three workers meet on 20 ticks; then two of them are SIGKILLed between ticks (one right
    after a tick, the other after the next) and replaced, for 20 more ticks at least. One set
    of processes serves both phases: starting a process costs seconds on this machine, and the
    replacements do their imports during the first phase."""
    clear_ticks(backend)
    name = f"per_ticks_{backend.strategy}"
    log = tmp_path / "workers.log"
    workers = [start_worker(backend, name, log) for _ in range(3)]
    originals = list(workers)
    go = [tmp_path / "go-0", tmp_path / "go-1"]
    spares: list[subprocess.Popen] = []
    try:
        wait_for(lambda: started(log, name) == 3, 120, "3 workers to start", log)
        spares = [start_worker(backend, name, log, "--wait-file", str(path)) for path in go]
        first = last_tick(backend, name) or dt.datetime.min.replace(tzinfo=UTC)
        wait_for(lambda: count_after(backend, name, first) >= 20, 60, "20 ticks", log)
        steady = last_tick(backend, name)
        kill_and_replace(backend, workers, 0, spares[0], go[0], name, log)
        kill_and_replace(backend, workers, 1, spares[1], go[1], name, log)
        wait_for(lambda: started(log, name) == 5, 120, "the replacements to start", log)
        wait_for(lambda: count_after(backend, name, steady) >= 20, 60, "20 more ticks", log)
    finally:
        for path in go:
            path.touch()  # a spare never used starts, then stops like the others
        codes = stop_all([*workers, *(s for s in spares if s not in workers)])
        for worker in originals[:2]:
            if worker.poll() is None:
                worker.kill()
    text = log.read_text()
    assert codes == [0, 0, 0], text[-3000:]
    assert [w.returncode for w in originals] == [-signal.SIGKILL, -signal.SIGKILL, 0]
    rows = assert_each_tick_once(backend, name)
    assert sum(first < t <= steady for t, _ in rows) >= 20
    assert sum(t > steady for t, _ in rows) >= 20
    # Each "enqueued" line is one committed tick: none twice. (A worker SIGKILLed between its
    # commit and its log line leaves a tick without a line.)
    logged = [tick for _, tick in logged_ticks(log)]
    assert len(logged) == len(set(logged)), "a tick was enqueued twice"
    assert set(logged) <= {t for t, _ in rows}
    # Every process checked the schedule: the first three, and the two that replaced two.
    checked = {int(pid) for pid in re.findall(r"pid=(\d+) DEBUG dbqueue\.periodic", text)}
    assert {w.pid for w in [*originals, *spares]} <= checked
    assert "Traceback" not in text and "WARNING" not in text, text[-3000:]


# ---- catch_up, changed schedules, purge --------------------------------------------------------
def at(hour: int, minute: int, second: int = 0) -> dt.datetime:
    return dt.datetime(2030, 1, 1, hour, minute, second, tzinfo=UTC)


def declare(app, cron: str = "*/5 * * * *") -> None:
    @app.task("per_report", queue="per_reports")
    def report(job, session) -> None:
        return None

    for mode in ("none", "latest", "all"):
        app.periodic(cron, name=f"per_{mode}", catch_up=mode, payload={"mode": mode}, priority=7)(
            report
        )


def enqueued(outcomes) -> dict[str, list[dt.datetime]]:
    found: dict[str, list[dt.datetime]] = {}
    for outcome in outcomes:
        assert outcome.job_id is not None
        found.setdefault(outcome.schedule, []).append(outcome.tick)
    return found


def test_catch_up_after_downtime_follows_each_mode(database):
    clear_ticks(database)
    app = database.app()
    declare(app)
    # First start, 2 s after a tick: the current tick is fresh, every mode enqueues it.
    first = enqueued(app.enqueue_periodic(at(12, 0, 2)))
    assert first == {f"per_{m}": [at(12, 0)] for m in ("none", "latest", "all")}
    assert app.enqueue_periodic(at(12, 0, 3)) == []  # met again: nothing twice
    # Down from 12:00:03 to 12:31: ticks 12:05 … 12:30 were missed; 12:30 is a minute old.
    after_downtime = enqueued(app.enqueue_periodic(at(12, 31)))
    assert after_downtime == {
        "per_latest": [at(12, 30)],
        "per_all": [at(12, m) for m in (5, 10, 15, 20, 25, 30)],
    }
    back = enqueued(app.enqueue_periodic(at(12, 35, 1)))
    assert back == {f"per_{m}": [at(12, 35)] for m in ("none", "latest", "all")}
    jobs = [j for j in database.jobs() if j["task"] == "per_report"]
    assert len(jobs) == 3 + 7 + 3
    job = next(j for j in jobs if j["payload"] == {"mode": "all"} and j["run_at"] == at(12, 5))
    assert (job["queue"], job["priority"]) == ("per_reports", 7)  # the task's queue, its priority


def test_a_new_schedule_enqueues_nothing_missed_and_a_changed_one_is_picked_up(database):
    clear_ticks(database)
    app = database.app()
    app.schedule("*/5 * * * *", task="per_report", name="per_all", catch_up="all")
    enqueued(app.enqueue_periodic(at(12, 0, 1)))
    # A schedule never seen before, started 30 s after its tick: that tick is not enqueued.
    fresh = database.app()
    fresh.schedule("*/5 * * * *", task="per_report", name="per_new", catch_up="all")
    assert fresh.enqueue_periodic(at(12, 30, 30)) == []
    assert enqueued(fresh.enqueue_periodic(at(12, 35))) == {"per_new": [at(12, 35)]}
    # The code changes per_all to every 10 minutes: its ticks after the last recorded one
    # (12:00) follow the new expression, with no migration.
    changed = database.app()
    changed.schedule("*/10 * * * *", task="per_report", name="per_all", catch_up="all")
    assert enqueued(changed.enqueue_periodic(at(12, 40, 5))) == {
        "per_all": [at(12, 10), at(12, 20), at(12, 30), at(12, 40)]
    }
    status = {row["name"]: row for row in changed.periodic_status()}
    assert status["per_all"]["cron"] == "*/10 * * * *"
    assert status["per_all"]["last_tick"] == at(12, 40)
    assert status["per_new"]["declared"] is False  # in the table, not in this App


def test_a_check_stopped_halfway_leaves_no_gap_and_the_next_one_resumes(database):
    clear_ticks(database)
    app = database.app()
    app.schedule("* * * * *", task="per_report", name="per_minutely", catch_up="all")
    enqueued(app.enqueue_periodic(at(12, 0, 1)))
    calls = iter(range(100))
    engine = write_target(app.engine)
    # The worker is told to stop after two of the ten missed ticks.
    done = enqueue_due(
        app.context, engine, app.schedules(), at(12, 10, 1), None, lambda: next(calls) >= 2
    )
    assert [o.tick for o in done] == [at(12, 1), at(12, 2)]
    assert enqueued(app.enqueue_periodic(at(12, 10, 2))) == {
        "per_minutely": [at(12, m) for m in range(3, 11)]
    }


def test_in_eager_mode_the_jobs_a_check_enqueues_run_at_once(database):
    clear_ticks(database)
    app = database.app(eager=True)
    ran = []

    @app.periodic("*/5 * * * *", name="per_eager")
    @app.task("per_eager_task")
    def handler(job, session) -> None:
        ran.append((job.id, job.run_at))

    outcomes = app.enqueue_periodic(at(12, 0, 1))
    assert ran == [(outcomes[0].job_id, at(12, 0))]
    assert app.get_job(outcomes[0].job_id)["status"] == "succeeded"


def test_purge_deletes_old_ticks_but_each_schedules_last(database):
    clear_ticks(database)
    app = database.app()
    app.schedule("0 * * * *", task="per_report", name="per_hourly", catch_up="all")
    app.schedule("0 0 * * *", task="per_report", name="per_daily", catch_up="all")
    old = dt.datetime(2020, 1, 1, 0, 0, 1, tzinfo=UTC)
    enqueued(app.enqueue_periodic(old))
    enqueued(app.enqueue_periodic(old + dt.timedelta(hours=5)))  # 5 more hourly ticks
    result = app.run_maintenance("purge")
    assert result.endswith("; 5 periodic tick(s)"), result
    rows = {name: tick_rows(database, name) for name in ("per_hourly", "per_daily")}
    assert [t for t, _ in rows["per_hourly"]] == [old.replace(hour=5, second=0)]
    assert [t for t, _ in rows["per_daily"]] == [old.replace(second=0)]
    assert app.run_maintenance("purge").endswith("chunk(s)")  # nothing more to delete


# ---- dbqueue periodic list ----------------------------------------------------------------------
APP_MODULE = """
import dbqueue

#: Run in the claim's transaction and outside it, under a lease (tests/conftest.py).
BOTH_MODES = True

app = dbqueue.App()

@app.periodic("0 3 * * *", name="per_nightly", tz="Europe/Berlin", catch_up="latest")
@app.task("per_report", queue="per_reports")
def report(job, session):
    return None

app.schedule(every=30, task="per_elsewhere", name="per_half_minute")
"""


def test_periodic_list_shows_each_schedule_its_ticks_and_last_job(database, tmp_path):
    clear_ticks(database)
    (tmp_path / "per_cli_app.py").write_text(APP_MODULE)
    options = ["--url", database.url, "--table-prefix", database.prefix]
    app = database.app()
    app.schedule("0 3 * * *", task="per_report", name="per_nightly", tz="Europe/Berlin")
    app.schedule("* * * * *", task="per_report", name="per_retired")
    night = dt.datetime(2030, 1, 1, 2, 0, 4, tzinfo=UTC)  # 03:00:04 in Berlin
    outcomes = app.enqueue_periodic(night)
    job_id = next(o.job_id for o in outcomes if o.schedule == "per_nightly")

    listed = invoke(["periodic", "list", *options, "--app", "per_cli_app:app"], tmp_path)
    assert listed.exit_code == 0 and listed.exception is None, listed
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert sorted(lines) == ["per_half_minute", "per_nightly", "per_retired"]
    nightly = lines["per_nightly"]
    assert "0 3 * * * (Europe/Berlin, catch_up latest)" in nightly
    assert "task per_report on queue per_reports" in nightly
    assert "last 2030-01-01T02:00:00+00:00" in nightly and f"job {job_id} available" in nightly
    assert "every 30s (UTC, catch_up none)" in lines["per_half_minute"]
    assert "no job yet" in lines["per_half_minute"]
    assert "(not in the --app)" in lines["per_retired"]

    as_json = invoke(["periodic", "list", *options, "--app", "per_cli_app:app", "--json"], tmp_path)
    rows: dict[str, Any] = {row["name"]: row for row in json.loads(as_json.stdout)}
    assert rows["per_nightly"]["last_tick"] == "2030-01-01T02:00:00+00:00"
    assert rows["per_nightly"]["last_job_id"] == job_id
    assert rows["per_nightly"]["last_job_status"] == "available"
    next_tick = dt.datetime.fromisoformat(rows["per_nightly"]["next_tick"])
    assert next_tick > dt.datetime.now(UTC)
    assert next_tick.astimezone(ZoneInfo("Europe/Berlin")).hour == 3
    assert rows["per_half_minute"]["task"] == "per_elsewhere"

    bare = invoke(["periodic", "list", *options], tmp_path)  # no --app: the table's names only
    assert "per_nightly" in bare.stdout and "(no --app)" in bare.stdout

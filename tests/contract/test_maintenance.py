"""Leader-only maintenance: purge, rescue, re-notify, and one worker per tick."""

from __future__ import annotations

import datetime as dt
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa
from support.lockserver import RawClient

WORKER = Path(__file__).resolve().parents[1] / "support" / "worker_process.py"
STARTED = ": strategy "  # in the line a worker logs once it runs, maintenance started


def all_started(log: Path, count: int, by: float) -> bool:
    """Whether ``count`` workers have logged their start to ``log`` by time ``by``."""
    while True:
        if log.exists() and log.read_text().count(STARTED) >= count:
            return True
        if time.time() >= by:
            return False
        time.sleep(0.05)


def start_purge_workers(database, log: Path, purge_slot: int) -> list[subprocess.Popen]:
    """Three worker processes whose purge is due on second ``purge_slot`` of each minute (one
    second stands in for a minute), rescue and re-notify half a minute away."""
    never = (purge_slot + 30) % 60
    env = {
        **os.environ,
        "DBQUEUE_MAINTENANCE_TICK": "1",
        "QUEUE_MINUTE_PURGE_THREAD": str(purge_slot),
        "QUEUE_MINUTE_RETRY_THREAD": str(never),
        "QUEUE_MINUTE_NOTIFY_THREAD": str(never),
        "QUEUE_PURGE_LIMIT": "4",
    }
    command = [
        sys.executable,
        str(WORKER),
        database.url,
        database.strategy,
        *database.worker_args(),
        "--debug",
    ]
    return [
        subprocess.Popen(command, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env)
        for _ in range(3)
    ]


def stop_workers(workers: list[subprocess.Popen]) -> list[int]:
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    return [worker.wait(timeout=60) for worker in workers]


def age_jobs(app, ids, *, days: float, status: str = "succeeded") -> None:
    """Make jobs finished ``days`` ago, as if they had run then."""
    jobs = app.tables.jobs
    when = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=days)
    with app.engine.begin() as conn:
        conn.execute(
            jobs.update().where(jobs.c.id.in_(ids)).values(status=status, finished_at=when)
        )


def fill_for_purge(app) -> dict[str, list[int]]:
    old = [app.enqueue(None, "t", {"i": i}) for i in range(7)]
    old_dead = [app.enqueue(None, "t", {"d": i}) for i in range(2)]
    recent = [app.enqueue(None, "t", {"r": i}) for i in range(3)]
    pending = [app.enqueue(None, "t", {"p": i}) for i in range(2)]
    age_jobs(app, old, days=90)
    age_jobs(app, old_dead, days=61, status="dead")
    age_jobs(app, recent, days=5)
    return {"old": old + old_dead, "kept": recent + pending}


def test_purge_deletes_only_old_finished_jobs_in_chunks(database):
    app = database.app()
    app = app.reconfigured(purge_limit=3, purge_max_age_days=60)
    ids = fill_for_purge(app)
    result = app.run_maintenance("purge")
    assert result == "deleted 9 finished jobs older than 60 days in 4 chunk(s)"
    assert sorted(j["id"] for j in database.jobs()) == sorted(ids["kept"])
    status = {row["routine"]: row for row in app.maintenance_status()}
    assert status["purge"]["runs"] == 1 and status["purge"]["result"] == result
    assert status["purge"]["finished_at"] >= status["purge"]["started_at"]


def test_rescue_retries_running_jobs_nobody_holds(backend):
    app = backend.app()
    job_id = app.enqueue(None, "t", {})
    jobs = app.tables.jobs
    with app.engine.begin() as conn:  # what a worker that died after its claim leaves behind
        conn.execute(
            jobs.update()
            .where(jobs.c.id == job_id)
            .values(
                status="running", attempt=1, worker_id="ghost:1:0", started_at=jobs.c.created_at
            )
        )
    result = app.run_maintenance("rescue", strategy=backend.strategy)
    job = app.get_job(job_id)
    if not backend.knows_live_workers:
        # No named locks: nothing can tell a live worker from a dead one, so nothing is touched.
        assert result.endswith("to tell a live worker from a dead one")
        assert job["status"] == "running"
        return
    assert result == f"rescued 1 job(s) whose worker died: {job_id}"
    assert (job["status"], job["attempt"]) == ("available", 1)
    assert "(ghost:1:0) died" in job["message"]
    (entry,) = job["errors"]  # the attempt the dead worker ran, in the job's list of errors
    assert (entry["attempt"], entry["message"], entry["traceback"]) == (1, job["message"], None)


def test_renotify_wakes_listeners_where_the_database_pushes(database):
    app = database.app()
    app.enqueue(None, "t", {}, queue="q1")
    app.enqueue(None, "t", {}, queue="q2", delay=3600)  # not runnable: not notified
    if database.claims_through_lock_server:  # SingleStore: the lock server pushes
        host, port = database.server.rsplit(":", 1)
        with RawClient(host, int(port)) as subscriber:
            assert subscriber.hello()["ok"]
            subscriber.request({"op": "subscribe", "id": 1, "queues": ["q1", "q2"]})
            assert app.run_maintenance("renotify") == "notified 1 queue(s): q1"
            assert subscriber.receive() == {"op": "wake", "queue": "q1"}
        return
    if not database.inserts_notify:
        assert app.run_maintenance("renotify") == "no push channel here: workers poll"
        return
    listener = app.create_engine()
    raw = listener.raw_connection()
    try:
        pg = raw.driver_connection
        pg.autocommit = True
        pg.cursor().execute(f'LISTEN "{app.names.qualified_jobs}"')
        result = app.run_maintenance("renotify")
        assert result == "notified 1 queue(s): q1"
        deadline = time.monotonic() + 10
        while not pg.notifies and time.monotonic() < deadline:
            pg.poll()
            time.sleep(0.02)
        assert [(n.channel, n.payload) for n in pg.notifies] == [(app.names.qualified_jobs, "q1")]
    finally:
        raw.close()
        listener.dispose()


def test_insert_trigger_notifies_once_per_statement_and_queue(notifying_database):
    app = notifying_database.app()
    listener = app.create_engine()
    raw = listener.raw_connection()
    try:
        pg = raw.driver_connection
        pg.autocommit = True
        pg.cursor().execute(f'LISTEN "{app.names.qualified_jobs}"')
        app.enqueue_many(None, [{"task": "t", "queue": q} for q in ("a", "b", "a", "a")])
        app.enqueue(None, "t", {}, queue="later", delay=600)  # notified: workers plan for it
        with app.engine.begin() as conn:  # a plain SQL insert by any client wakes workers too
            conn.execute(sa.text(f"INSERT INTO {app.names.jobs} (task, queue) VALUES ('x', 'c')"))
        deadline = time.monotonic() + 10
        while len(pg.notifies) < 4 and time.monotonic() < deadline:
            pg.poll()
            time.sleep(0.02)
        time.sleep(0.2)
        pg.poll()
        assert sorted(n.payload for n in pg.notifies) == ["a", "b", "c", "later"]
    finally:
        raw.close()
        listener.dispose()


def test_three_workers_meet_on_one_purge_tick_and_exactly_one_purges(database, tmp_path):
    app = database.app()
    ids = fill_for_purge(app)
    log = tmp_path / "workers.log"
    # Ticks of one second stand in for clock minutes; purge is due on one tick, a few seconds
    # ahead, and rescue/re-notify never in this test. A worker only meets ticks after it
    # started: when a loaded machine has not started all three a second before the tick, they
    # are stopped (before the tick: nothing has run) and started again with a wider margin.
    for margin in (4, 8, 16):
        target = math.ceil(time.time()) + margin
        workers = start_purge_workers(database, log, purge_slot=target % 60)
        if all_started(log, len(workers), by=target - 1):
            break
        stop_workers(workers)
        log.unlink()
    else:
        raise AssertionError("three workers never all started 15 s ahead of their tick")
    try:
        tick = dt.datetime.fromtimestamp(target, dt.timezone.utc)
        deadline = target + 15
        while time.time() < deadline:
            status = {row["routine"]: row for row in app.maintenance_status()}
            if status["purge"]["last_tick"] == tick and status["purge"]["finished_at"]:
                break
            time.sleep(0.1)
        time.sleep(1.5)  # let the two losers finish their attempt at the tick
    finally:
        codes = stop_workers(workers)
    text = log.read_text()
    assert codes == [0, 0, 0], text[-3000:]
    status = {row["routine"]: row for row in app.maintenance_status()}
    purge = status["purge"]
    assert purge["runs"] == 1, text[-3000:]  # exactly one purge ran, and it is recorded
    assert purge["last_tick"] == tick
    assert purge["result"] == "deleted 9 finished jobs older than 60 days in 3 chunk(s)"
    assert sorted(j["id"] for j in database.jobs()) == sorted(ids["kept"])
    assert text.count("purge (tick") == 1
    assert text.count("another worker has it") == 2  # the other two met it on the same tick
    assert status["rescue"]["runs"] == 0 and status["renotify"]["runs"] == 0

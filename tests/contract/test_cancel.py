"""Cancellation on every backend: waiting and scheduled jobs at once (in the caller's
transaction), running jobs by request in a real worker process (seen by a cooperative handler,
enforced on one that ignores it or is blocked in C), finished jobs left alone, pub/sub
deliveries one by one and per publication — and a cancel never waits for a running job's lock.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from support.backends import effect_rows, effects
from support.cli_runner import assert_one_line_error, invoke
from support.waiting import wait_for

import dbqueue

#: Run in the claim's transaction and outside it, under a lease (tests/conftest.py).
BOTH_MODES = True

WORKER = Path(__file__).resolve().parents[1] / "support" / "cancel_worker.py"
#: How long a cancel may take before the test calls it stuck: a liveness bound, not a speed one
#: (on SQLite the call waits for the write lock, which the stopped job's batch gives back).
STUCK = 30.0


def statuses(backend, *ids: int) -> list[str]:
    jobs = {j["id"]: j for j in backend.jobs()}
    return [jobs[i]["status"] for i in ids]


def test_waiting_and_scheduled_jobs_are_cancelled_at_once_and_finished_ones_left_alone(backend):
    app = backend.app()

    @app.task("can_ok")
    def ok(job, session):
        session.execute(effects.insert().values(job_id=job.id, note="ran"))

    @app.task("can_boom", max_attempts=1)
    def boom(job, session):
        raise RuntimeError("boom")

    done, dead = app.enqueue(None, "can_ok"), app.enqueue(None, "can_boom")
    backend.run_worker(app)
    due, scheduled = app.enqueue(None, "can_ok"), app.enqueue(None, "can_ok", delay=3600)

    # In the caller's transaction: rolled back, nothing changes.
    engine = backend.engine()
    try:
        with Session(engine) as session:
            session.begin()
            assert app.cancel([due, scheduled], session) == {
                due: "cancelled",
                scheduled: "cancelled",
            }
            assert app.get_job(due, session)["status"] == "cancelled"
            session.rollback()
    finally:
        engine.dispose()
    assert statuses(backend, due, scheduled) == ["available", "available"]

    finished_before = {j["id"]: j for j in backend.jobs() if j["id"] in (done, dead)}
    report = app.cancel([due, scheduled, done, dead, 10**9])
    assert report == {
        due: "cancelled",
        scheduled: "cancelled",
        done: "already succeeded",
        dead: "already dead",
        10**9: "not found",
    }
    assert list(report) == [due, scheduled, done, dead, 10**9]  # in the order given
    assert app.cancel(due) == {due: "already cancelled"}

    jobs = {j["id"]: j for j in backend.jobs()}
    for job_id in (due, scheduled):
        job = jobs[job_id]
        assert (job["status"], job["attempt"]) == ("cancelled", 0)
        assert job["message"] == "cancelled while waiting to run"
        assert job["finished_at"] is not None and job["cancel_requested_at"] is not None
    for job_id, before in finished_before.items():  # a no-op: not one column changed
        assert jobs[job_id] == before

    backend.run_worker(app)  # nothing cancelled runs
    assert [row[0] for row in effect_rows(backend)] == [done]
    assert statuses(backend, due, scheduled) == ["cancelled", "cancelled"]


def _no_waiting_connection(backend, engine: sa.Engine) -> sa.Connection:
    """A connection that fails, instead of waiting, on a row lock held for over 3 seconds:
    a cancel made through it proves it never waited for the running job's lock."""
    conn = engine.connect()
    if not backend.single_writer:  # (SQLite has no row locks: its cancels go to a side file)
        conn.execute(sa.text(backend.lock_wait_limit(3)))
    conn.commit()
    return conn


def _cancel_promptly(app: dbqueue.App, backend, job_id: int) -> str:
    """``app.cancel(job_id)`` in its own transaction on a no-waiting connection, in a thread
    that must be done within STUCK seconds."""
    engine = backend.engine()
    outcome: dict[str, Any] = {}

    def cancel() -> None:
        try:
            with _no_waiting_connection(backend, engine) as conn, conn.begin():
                outcome["report"] = app.cancel([job_id], conn)
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    thread = threading.Thread(target=cancel, daemon=True)
    try:
        thread.start()
        thread.join(STUCK)
        assert not thread.is_alive(), f"app.cancel({job_id}) of a running job is stuck"
    finally:
        engine.dispose()
    assert "error" not in outcome, outcome["error"]
    return outcome["report"][job_id]


def test_running_jobs_are_stopped_by_their_worker_and_their_writes_rolled_back(backend, tmp_path):
    app = backend.app()
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), backend.url, backend.strategy, *backend.worker_args()],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    ids: dict[str, int] = {}
    said_by_task: dict[str, str] = {}
    try:
        wait_for(lambda: "concurrency 3" in log.read_text(), 60, "the worker to start", log)
        for task in ("cooperative", "stubborn", "blocked"):
            ids[task] = job_id = app.enqueue(None, task, {"dir": str(tmp_path)})
            started = tmp_path / f"started-{job_id}"
            wait_for(started.exists, 30, f"{task} job {job_id} to start", log)
            said = said_by_task[task] = _cancel_promptly(app, backend, job_id)
            if app.context.cancel_requests().separate:
                # SQLite: a job its batch holds looks waiting; the call (after asking the
                # workers to stop it) waits for the write lock, which the stopped batch frees.
                assert said in ("cancelled", "cancel requested"), (task, said)
            else:
                assert said == "cancel requested", (task, said)  # at once, the job running

        def all_cancelled() -> bool:
            return statuses(backend, *ids.values()) == ["cancelled"] * 3

        wait_for(all_cancelled, STUCK, "the three jobs to end cancelled", log)
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    output = log.read_text()
    assert code == 0, output[-3000:]
    # SQLite: a stopped batch rolls back and its job looks waiting, but the worker marked the
    # request taken before stopping it: the call waiting for the write lock leaves it to the
    # worker, which records each end itself (attempt 1, and why it stopped the job).
    assert "SUMMARY succeeded=0 failed=0 cancelled=3" in output, output[-3000:]

    jobs = {j["id"]: j for j in backend.jobs()}
    assert len(jobs) == 3  # not retried, no dead-letter job
    for task, job_id in ids.items():
        job = jobs[job_id]
        assert (job["status"], job["attempt"], job["dead"]) == ("cancelled", 1, False), task
        assert job["message"].startswith("cancelled on request (asked at "), job["message"]
        assert job["cancel_requested_at"] <= job["finished_at"]
    assert (tmp_path / f"saw-{ids['cooperative']}").exists()  # job.cancel_requested() was true
    assert (tmp_path / f"interrupted-{ids['stubborn']}").exists()  # JobCancelledError raised
    assert "its thread was abandoned" in jobs[ids["blocked"]]["message"]
    assert effect_rows(backend) == []  # every handler's write rolled back, no dead handler ran
    store = app.context.cancel_requests()
    with backend.engine().connect() as conn:
        assert store.pending(conn, list(ids.values())) == {}  # the requests are gone
    store.close()


def test_a_request_a_worker_took_holds_back_one_call_only(database):
    """A worker marks a request taken before stopping its job (SQLite: the job then looks
    waiting to the call). A mark left by a worker that died before recording the job's end
    misleads one call, which consumes it; the next one cancels the waiting job."""
    app = database.app()
    job_id = app.enqueue(None, "t", {})
    store = app.context.cancel_requests()
    store.take([job_id])
    if store.separate:
        assert app.cancel(job_id) == {job_id: "cancel requested"}
        with database.engine().connect() as conn:
            assert list(store.pending(conn, [job_id])) == [job_id]  # the request stays
    assert app.cancel(job_id) == {job_id: "cancelled"}
    assert app.cancel(job_id) == {job_id: "already cancelled"}
    with database.engine().connect() as conn:
        assert store.pending(conn, [job_id]) == {}
        assert store.consume_taken([job_id]) == set()
    store.close()


def test_pubsub_deliveries_cancel_one_by_one_or_per_publication(database):
    app = database.app()
    for name in ("can_a", "can_b", "can_c"):
        app.add_subscription(None, name, "can.topic")
        app.subscriber("can.topic", name)(lambda job, session: None)
    publication = app.publish(None, "can.topic", {"n": 1})
    other = app.publish(None, "can.topic", {"n": 2})
    deliveries = {sub: job["id"] for sub, job in database.deliveries(publication).items()}
    a, b, c = deliveries["can_a"], deliveries["can_b"], deliveries["can_c"]

    assert app.cancel(a) == {a: "cancelled"}
    assert app.cancel_publication(publication) == {
        a: "already cancelled",
        b: "cancelled",
        c: "cancelled",
    }
    jobs = {j["id"]: j for j in database.jobs()}
    assert jobs[publication]["status"] == "succeeded"  # the publication's own record
    assert {j["status"] for j in database.deliveries(other).values()} == {"available"}
    assert app.cancel_publication(10**9) == {}


def test_cli_cancel_prints_one_line_per_job(database, tmp_path):
    app = database.app()
    waiting = app.enqueue(None, "can_cli")
    publication_ids = []
    app.add_subscription(None, "can_cli_sub", "can.cli")
    publication_ids.append(app.publish(None, "can.cli", {}))
    (delivery,) = [j["id"] for j in database.deliveries(publication_ids[0]).values()]
    base = ["--url", database.url, "--table-prefix", database.prefix]

    done = invoke(["cancel", *base, str(waiting)], tmp_path, database.env())
    assert (done.exit_code, done.stdout) == (0, f"job {waiting}: cancelled\n"), done.stderr
    again = invoke(["cancel", *base, str(waiting), "999999"], tmp_path, database.env())
    assert again.stdout == f"job {waiting}: already cancelled\njob 999999: not found\n"
    assert_one_line_error(again, "no such job: 999999")

    per_publication = invoke(
        ["cancel-publication", *base, str(publication_ids[0]), "--json"], tmp_path, database.env()
    )
    assert per_publication.exit_code == 0, per_publication.stderr
    assert per_publication.stdout.strip().startswith("{")
    assert f'"{delivery}": "cancelled"' in per_publication.stdout
    assert statuses(database, waiting, delivery) == ["cancelled", "cancelled"]


@pytest.mark.parametrize("ids", ["12", [1, True], [0], 2.5, [None]])
def test_ids_that_are_not_job_ids_are_refused_in_one_line(ids, tmp_path):
    app = dbqueue.App(f"sqlite:///{tmp_path / 'never-created.db'}")
    with pytest.raises(dbqueue.ConfigurationError, match="is not a job id: pass a whole number"):
        app.cancel(ids)
    assert not (tmp_path / "never-created.db").exists()


def test_purge_forgets_the_requests_of_jobs_that_ended(database):
    """A job may end before its worker sees a request (it finished first): purge deletes such
    requests, and keeps those of jobs that may still run."""
    app = database.app()
    ended, waiting = app.enqueue(None, "can_x"), app.enqueue(None, "can_x")
    app.cancel(ended)
    store = app.context.cancel_requests()
    engine = database.engine()
    try:
        with engine.begin() as conn:
            store.add(conn, [ended, waiting])  # as if asked while they ran
        result = app.run_maintenance("purge")
        assert result.endswith(", and the cancel requests of 1 ended job(s)"), result
        with engine.connect() as conn:
            assert list(store.pending(conn, [ended, waiting])) == [waiting]
    finally:
        store.close()
        engine.dispose()

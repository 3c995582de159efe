"""Results, synchronous calls, Discard and Retry, on every (database, strategy) pair."""

from __future__ import annotations

import datetime as dt
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.backends import effect_rows, effects
from support.waiting import wait_for

import dbqueue
from dbqueue.app import calls
from dbqueue.base import results
from dbqueue.lockserver import client as lockserver_client
from dbqueue.lockserver.protocol import parse_address

#: Run in the claim's transaction and outside it, under a lease (tests/conftest.py).
BOTH_MODES = True

WORKER = Path(__file__).resolve().parents[1] / "support" / "results_worker.py"
NESTED = {"name": "olá", "items": [1, 2.5, None, True, {"deep": ["x", []]}], "empty": {}}


def seconds(delta: dt.timedelta) -> float:
    return delta.total_seconds()


def make_due(app: dbqueue.App, job_id: int) -> None:
    jobs = app.tables.jobs
    with app.engine.begin() as conn:
        conn.execute(jobs.update().where(jobs.c.id == job_id).values(run_at=jobs.c.created_at))


def test_results_are_stored_as_json_and_read_back(backend):
    app = backend.app()

    @app.task("nested")
    def nested(job, session):
        return NESTED

    @app.task("nothing")
    def nothing(job, session):
        session.execute(effects.insert().values(job_id=job.id, note="nothing"))

    @app.task("a_set", max_attempts=2, backoff=lambda attempt: 0.0)
    def a_set(job, session):
        session.execute(effects.insert().values(job_id=job.id, note=f"attempt {job.attempt}"))
        return {"tags": {"a", "b"}}

    nested_id = app.enqueue(None, "nested")
    nothing_id = app.enqueue(None, "nothing")
    set_id = app.enqueue(None, "a_set")
    backend.drain(app)
    jobs = {j["id"]: j for j in backend.jobs()}

    assert (jobs[nested_id]["status"], jobs[nested_id]["result"]) == ("succeeded", NESTED)
    assert jobs[nested_id]["message"] is None  # success: the value is the result, not a message
    assert app.result(nested_id) == NESTED
    assert (jobs[nothing_id]["status"], jobs[nothing_id]["result"]) == ("succeeded", None)
    assert app.result(nothing_id) is None

    # A value JSON cannot represent fails the attempt (retried, then dead); its writes roll back.
    failed = jobs[set_id]
    assert (failed["status"], failed["attempt"], failed["result"]) == ("dead", 2, None)
    assert failed["message"].startswith(
        "the handler returned a dict (result['tags']: value of type set), which JSON cannot "
        "represent: return a list, dict, str, number, bool or None"
    ), failed["message"]
    assert failed["previous_message"] == failed["message"]
    assert [row[0] for row in effect_rows(backend)] == [nothing_id]
    with pytest.raises(dbqueue.JobFailedError) as dead:
        app.result(set_id)
    assert (dead.value.job_id, dead.value.last_error) == (set_id, failed["message"])
    assert f"job {set_id} (task 'a_set') is dead after attempt 2 of 2" in str(dead.value)

    scheduled = app.enqueue(None, "nested", delay=3600)
    with pytest.raises(dbqueue.JobNotFinishedError, match="pass timeout=SECONDS") as early:
        app.result(scheduled)
    assert isinstance(early.value, TimeoutError) and early.value.job_id == scheduled
    with pytest.raises(TimeoutError, match="did not finish within 0.2 s"):
        app.result(scheduled, timeout=0.2)
    with pytest.raises(dbqueue.JobNotFoundError, match="there is no job 987654321"):
        app.result(987654321)
    app.cancel([scheduled])
    with pytest.raises(dbqueue.JobCancelledError, match="was cancelled: it has no result") as gone:
        app.result(scheduled)
    assert isinstance(gone.value, dbqueue.JobFailedError) and gone.value.job_id == scheduled


@pytest.fixture
def pushed_only(monkeypatch):
    """Where a job's end is pushed (PostgreSQL's NOTIFY, the lock server) a caller re-reads the
    row only every PUSHED_POLL seconds: an hour here, so a call returns in time only if the
    push reached it. Elsewhere the caller polls (5 ms growing to 200 ms)."""
    monkeypatch.setattr(calls, "PUSHED_POLL", 3600.0)


def test_call_returns_the_value_and_raises_for_dead_jobs_timeouts_and_calls_from_handlers(
    backend, pushed_only
):
    app = backend.app()

    @app.task("add")
    def add(job, session):
        return {"sum": job.payload["a"] + job.payload["b"], "echo": job.payload}

    @app.task("nothing")
    def nothing(job, session):
        return None

    @app.task("boom", max_attempts=1)
    def boom(job, session):
        raise RuntimeError(job.payload["why"])

    @app.task("calls_back", max_attempts=1)
    def calls_back(job, session):
        return app.call("add", {"a": 1, "b": 1}, timeout=5)

    worker = app.worker(strategy=backend.strategy, install_signal_handlers=False, maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        answer = app.call("add", {"a": 2, "b": 3, "nested": NESTED}, timeout=30)
        assert answer == {"sum": 5, "echo": {"a": 2, "b": 3, "nested": NESTED}}
        assert app.call("nothing", timeout=30) is None

        with pytest.raises(dbqueue.JobFailedError) as dead:
            app.call("boom", {"why": "the printer is on fire"}, timeout=30)
        assert dead.value.last_error.startswith("RuntimeError: the printer is on fire")
        assert app.get_job(dead.value.job_id)["status"] == "dead"

        with pytest.raises(dbqueue.JobFailedError) as refused:
            app.call("calls_back", timeout=30)
        assert refused.value.last_error.startswith(
            "CallFromHandlerError: app.call('add') inside a handler"
        )
        assert {j["task"] for j in backend.jobs()} == {"add", "nothing", "boom", "calls_back"}

        with pytest.raises(TimeoutError, match="did not finish within 0.3 s") as late:
            app.call("add", {"a": 1, "b": 1}, queue="nobody_consumes_this", timeout=0.3)
        assert isinstance(late.value, dbqueue.JobNotFinishedError)
        assert app.get_job(late.value.job_id)["status"] == "available"  # it stays queued
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()


@pytest.mark.parametrize("backend", ["postgresql-skip_locked", "mysql-lock_server"], indirect=True)
def test_call_waits_for_a_worker_process(backend, tmp_path, pushed_only):
    """The caller and the worker in different processes, each woken by a push alone (the
    worker polls once an hour, the caller's fallback read is an hour apart): PostgreSQL's
    NOTIFY both ways, or the lock server's. (Polling is the same across processes as within
    one.)"""
    database = backend
    app = database.app()
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), database.url, database.strategy, *database.worker_args()],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    try:
        answer = app.call("add", {"a": 2, "b": 3}, timeout=60)
        assert answer == {"sum": 5, "by": worker.pid, "echo": {"a": 2, "b": 3}}
        with pytest.raises(dbqueue.JobFailedError) as dead:
            # The caller's App does not register "boom": its options are given here.
            app.call("boom", {"why": "out of paper"}, max_attempts=1, timeout=30)
        assert dead.value.last_error.startswith("RuntimeError: out of paper")
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    assert code == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()


def test_call_in_eager_mode_runs_the_job_at_once(database):
    app = database.app(eager=True)

    @app.task("double")
    def double(job, session):
        return job.payload * 2

    @app.task("calls_back", max_attempts=1)
    def calls_back(job, session):
        return app.call("double", 1)  # it would be queued after this job: refused

    assert app.call("double", 21, timeout=0) == 42  # ran before call() began to wait
    with pytest.raises(dbqueue.JobFailedError) as refused:
        app.call("calls_back", timeout=0)
    assert refused.value.last_error.startswith("CallFromHandlerError: app.call('double')")
    assert [j["task"] for j in database.jobs()] == ["double", "calls_back"]


def test_discard_makes_the_job_dead_at_once_and_its_dead_handler_runs(backend):
    app = backend.app()
    app.add_subscription(None, "audit", "order.deleted")

    @app.task("picky", max_attempts=5)
    def picky(job, session):
        session.execute(effects.insert().values(job_id=job.id, note="discarding attempt"))
        raise dbqueue.Discard(f"order {job.payload['order']} was deleted")

    @app.dead_handler("picky")
    def picky_dead(job, session):
        session.execute(effects.insert().values(job_id=job.id, note="dead handler"))
        return {"cleaned_up": job.live_id}

    @app.subscriber("order.deleted", "audit", max_attempts=5)
    def audit(job, session):
        raise dbqueue.Discard()

    @app.dead_subscriber("order.deleted", "audit")
    def audit_dead(job, session):
        return "audit gave up"

    job_id = app.enqueue(None, "picky", {"order": 42})
    publication_id = app.publish(None, "order.deleted", {"order": 42})
    backend.drain(app)

    live = app.get_job(job_id)
    assert (live["status"], live["attempt"], live["max_attempts"]) == ("dead", 1, 5)
    assert live["message"] == "Discard: order 42 was deleted"
    assert (live["previous_status"], live["previous_message"]) == ("failed", live["message"])
    assert live["previous_attempt_at"] == live["started_at"] and live["finished_at"] is not None
    jobs = backend.jobs()
    (dead,) = [j for j in jobs if j["dead"] and j["live_id"] == job_id]
    assert (dead["status"], dead["result"]) == ("succeeded", {"cleaned_up": job_id})
    assert effect_rows(backend, "job_id", "note") == [(dead["id"], "dead handler")]
    with pytest.raises(dbqueue.JobFailedError) as failed:
        app.result(job_id)
    assert failed.value.last_error == "Discard: order 42 was deleted"

    delivery = backend.deliveries(publication_id)["audit"]
    assert (delivery["status"], delivery["attempt"]) == ("dead", 1)
    assert delivery["message"] == "Discard: the handler discarded the job"
    (audit_letter,) = [j for j in jobs if j["dead"] and j["live_id"] == delivery["id"]]
    assert (audit_letter["status"], audit_letter["result"]) == ("succeeded", "audit gave up")


def test_retry_reschedules_after_exactly_its_delay_and_dies_on_the_last_attempt(backend):
    app = backend.app()
    app.add_subscription(None, "mailer", "user.joined")

    @app.task("rate_limited", max_attempts=2, backoff=lambda attempt: 3600.0)
    def rate_limited(job, session):
        session.execute(effects.insert().values(job_id=job.id, note=f"attempt {job.attempt}"))
        raise dbqueue.Retry("429 from the API", in_seconds=42.5)

    @app.dead_handler("rate_limited")
    def rate_limited_dead(job, session):
        return "gave up"

    @app.subscriber("user.joined", "mailer", backoff=lambda attempt: 3600.0)
    def mailer(job, session):
        if job.attempt == 1:
            raise dbqueue.Retry(in_seconds=dt.timedelta(0))
        return "sent"

    @app.task("bad_retry", max_attempts=1)
    def bad_retry(job, session):
        raise dbqueue.Retry(in_seconds=-1)

    job_id = app.enqueue(None, "rate_limited", {})
    bad_id = app.enqueue(None, "bad_retry", {})
    backend.run_worker(app)
    job = app.get_job(job_id)
    assert (job["status"], job["attempt"]) == ("available", 1)
    assert job["message"] == "Retry(in_seconds=42.5): 429 from the API"
    assert (job["previous_status"], job["previous_message"]) == ("failed", job["message"])
    # run_at and updated_at come from the same statement's clock: exactly the delay apart,
    # not the task's hour-long backoff.
    assert seconds(job["run_at"] - job["updated_at"]) == pytest.approx(42.5, abs=0.005)
    bad = app.get_job(bad_id)
    assert (
        bad["status"] == "dead" and "ValueError: Retry(in_seconds=-1): in_seconds" in bad["message"]
    )

    make_due(app, job_id)  # the operator's plain SQL; then the last attempt asks again
    backend.drain(app)
    job = app.get_job(job_id)
    assert (job["status"], job["attempt"]) == ("dead", 2)
    assert job["message"] == "Retry(in_seconds=42.5): 429 from the API"
    (letter,) = [j for j in backend.jobs() if j["dead"] and j["live_id"] == job_id]
    assert (letter["status"], letter["result"]) == ("succeeded", "gave up")
    assert effect_rows(backend, "job_id", "note") == []  # each attempt's write rolled back

    publication_id = app.publish(None, "user.joined", {"user": 7})
    backend.drain(app)
    delivery = backend.deliveries(publication_id)["mailer"]
    assert (delivery["status"], delivery["attempt"], delivery["result"]) == ("succeeded", 2, "sent")
    assert delivery["previous_message"] == "Retry(in_seconds=0)"


@pytest.mark.parametrize(
    "backend",
    [
        "postgresql-skip_locked",
        "postgresql-advisory_lock",
        "mysql-lock_server",
        "sqlite-lock_server",
    ],
    indirect=True,
)
def test_only_the_end_of_an_awaited_job_is_pushed(backend):
    """A job ``call`` waits for is announced when it finishes (NOTIFY on PostgreSQL, a lock
    server push where the lock server is used); a job nobody waits for costs no announcement."""
    app = backend.app()

    @app.task("quick")
    def quick(job, session):
        return job.id

    heard: list[str] = []
    stop = threading.Event()
    listening = threading.Event()
    if backend.claims_through_lock_server:
        client = lockserver_client.connect(parse_address(backend.server), token=None, timeout=5)
        client.wait_connected(5)
    else:
        client = None
        raw = app.engine.raw_connection()
        raw.driver_connection.autocommit = True
        thread = threading.Thread(target=_listen, args=(raw, app, heard, stop, listening))
        thread.start()
        assert listening.wait(10)
    try:
        plain_id = app.enqueue(None, "quick")
        with pytest.raises(TimeoutError):
            app.call("quick", timeout=0)  # enqueued, marked awaited; nobody waits any longer
        awaited_id = max(j["id"] for j in backend.jobs())
        if client is not None:
            channel = app.names.qualified_jobs
            for job_id in (plain_id, awaited_id):
                name = results.finished_name(channel, job_id)
                client.subscribe([name], heard.append)
        backend.run_worker(app)
        wanted = (
            results.finished_name(app.names.qualified_jobs, awaited_id)
            if client is not None
            else results.finished_notice([awaited_id])
        )
        wait_for(lambda: wanted in heard, 20, f"the announcement {wanted!r}")
        assert [h for h in heard if str(plain_id) in h.split()] == [], heard
    finally:
        stop.set()
        if client is not None:
            lockserver_client.disconnect(client)
        else:
            thread.join(10)
            raw.close()
    assert app.result(awaited_id) == awaited_id and app.result(plain_id) == plain_id


def _listen(raw, app, heard, stop, listening) -> None:
    dbapi = raw.driver_connection
    with dbapi.cursor() as cursor:
        cursor.execute(f'LISTEN "{app.names.qualified_jobs}"')
    listening.set()
    while not stop.is_set():
        if select.select([dbapi], [], [], 0.1)[0]:
            dbapi.poll()
            heard.extend(n.payload for n in dbapi.notifies)
            dbapi.notifies.clear()


def test_a_handler_result_over_the_payload_limit_fails_the_attempt(database):
    app = database.app(max_payload_bytes=1000)

    @app.task("big", max_attempts=1)
    def big(job, session):
        return "x" * 2000

    job_id = app.enqueue(None, "big")
    database.run_worker(app)
    job = app.get_job(job_id)
    assert job["status"] == "dead" and job["result"] is None
    assert job["message"].startswith("the handler's result is 2002 bytes, over the limit of 1000")

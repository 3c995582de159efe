"""Failures, retries, dead jobs and dead handlers, on every backend."""

from __future__ import annotations

import pytest
from support.backends import effects
from support.handlers import KINDS, handler


def seconds(delta) -> float:
    return delta.total_seconds()


@KINDS
@pytest.mark.both_modes
def test_failure_records_the_attempt_and_retry_honours_the_backoff(backend, kind):
    app = backend.app()

    @app.task("flaky", backoff=lambda attempt: 60.0 * attempt, max_attempts=5)
    @handler(kind)
    def flaky(job, session):
        raise ConnectionError(f"gateway down (attempt {job.attempt})")

    job_id = app.enqueue(None, "flaky", {})
    backend.run_worker(app)
    job = app.get_job(job_id)
    assert job["status"] == "available"
    assert job["attempt"] == 1
    assert job["message"].startswith("ConnectionError: gateway down (attempt 1)")
    assert "Traceback" in job["message"]
    assert job["previous_status"] == "failed"
    assert job["previous_message"] == job["message"]
    assert job["first_attempt_at"] == job["previous_attempt_at"] == job["started_at"]
    # run_at and updated_at come from the same statement's clock: exactly the backoff apart.
    assert seconds(job["run_at"] - job["updated_at"]) == pytest.approx(60.0, abs=0.005)

    # Not runnable before its time: a burst worker finds nothing.
    assert backend.run_worker(app).processed == 0
    make_due(app, job_id)
    backend.run_worker(app)
    job = app.get_job(job_id)
    assert job["attempt"] == 2
    assert job["message"].startswith("ConnectionError: gateway down (attempt 2)")
    assert seconds(job["run_at"] - job["updated_at"]) == pytest.approx(120.0, abs=0.005)


def make_due(app, job_id):
    """Move a scheduled retry to now, as an operator could with plain SQL."""
    jobs = app.tables.jobs
    with app.engine.begin() as conn:
        conn.execute(jobs.update().where(jobs.c.id == job_id).values(run_at=jobs.c.created_at))


def test_default_backoff_is_base_interval_times_attempt(backend):
    app = backend.app(retry_base_interval=7)

    @app.task("fails")
    def fails(job, session):
        raise RuntimeError("no")

    job_id = app.enqueue(None, "fails", {})
    backend.run_worker(app)
    job = app.get_job(job_id)
    assert seconds(job["run_at"] - job["updated_at"]) == pytest.approx(7.0, abs=0.005)


def test_a_callable_backoff_on_the_app_replaces_the_default(backend):
    app = backend.app(backoff=lambda attempt: 42.5)

    @app.task("fails")
    def fails(job, session):
        raise RuntimeError("no")

    job_id = app.enqueue(None, "fails", {})
    backend.run_worker(app)
    job = app.get_job(job_id)
    assert seconds(job["run_at"] - job["updated_at"]) == pytest.approx(42.5, abs=0.005)


@KINDS
@pytest.mark.both_modes
def test_retried_job_eventually_succeeds(backend, kind):
    app = backend.app(retry_base_interval=0.05)
    attempts = []

    @app.task("third_time_lucky", max_attempts=5)
    @handler(kind)
    def lucky(job, session):
        attempts.append(job.attempt)
        session.execute(effects.insert().values(job_id=job.id, note=f"attempt {job.attempt}"))
        if job.attempt < 3:
            raise RuntimeError("not yet")
        return "finally"

    job_id = app.enqueue(None, "third_time_lucky", {})
    backend.drain(app, rounds=50)
    job = app.get_job(job_id)
    assert attempts == [1, 2, 3]
    assert (job["status"], job["attempt"], job["result"]) == ("succeeded", 3, "finally")
    assert job["message"] is None  # a success clears the failed attempt's message
    assert job["previous_message"].startswith("RuntimeError: not yet")
    assert backend.effect_ids() == [job_id]  # only the successful attempt's write remains


@KINDS
def test_exhausted_job_is_dead_and_its_dead_handler_runs_with_the_live_id(backend, kind):
    app = backend.app(retry_base_interval=0.01)
    dead_seen = []

    @app.task("doomed", max_attempts=2)
    @handler(kind)
    def doomed(job, session):
        raise ValueError("always fails")

    @app.dead_handler("doomed")
    @handler(kind)
    def doomed_dead(job, session):
        dead_seen.append((job.dead, job.live_id, job.payload, job.attempt))
        session.execute(effects.insert().values(job_id=job.id, note="dead handler ran"))
        return "compensated"

    live_id = app.enqueue(None, "doomed", {"order": 9}, tenant=4, external_key="k9")
    backend.drain(app, rounds=50)
    jobs = {j["id"]: j for j in backend.jobs()}
    live = jobs[live_id]
    assert (live["status"], live["attempt"], live["dead"]) == ("dead", 2, False)
    assert live["finished_at"] is not None
    (dead_id,) = [i for i in jobs if i != live_id]
    dead = jobs[dead_id]
    assert dead["dead"] is True and dead["live_id"] == live_id
    assert (dead["status"], dead["result"]) == ("succeeded", "compensated")
    assert dead["payload"] == {"order": 9} and dead["tenant"] == 4 and dead["external_key"] == "k9"
    assert dead_seen == [(True, live_id, {"order": 9}, 1)]
    assert backend.effect_ids() == [dead_id]


def test_without_a_dead_handler_the_job_just_dies(backend):
    app = backend.app(retry_base_interval=0.01)

    @app.task("doomed", max_attempts=1)
    def doomed(job, session):
        raise ValueError("always fails")

    job_id = app.enqueue(None, "doomed", {})
    backend.run_worker(app)
    jobs = backend.jobs()
    assert [(j["id"], j["status"]) for j in jobs] == [(job_id, "dead")]


def test_a_failing_dead_handler_retries_then_dies_without_recursion(backend):
    app = backend.app(retry_base_interval=0.01)

    @app.task("doomed", max_attempts=2)
    def doomed(job, session):
        raise ValueError("live fails")

    @app.dead_handler("doomed")
    def doomed_dead(job, session):
        raise ValueError("dead handler fails too")

    app.enqueue(None, "doomed", {})
    backend.drain(app, rounds=50)
    jobs = backend.jobs()
    assert len(jobs) == 2
    assert all(j["status"] == "dead" and j["attempt"] == 2 for j in jobs)
    assert [j["dead"] for j in jobs] == [False, True]


def test_dead_jobs_can_be_listed_and_requeued(backend):
    app = backend.app(retry_base_interval=0.01)
    outcome = {"fail": True}

    @app.task("fixable", max_attempts=1)
    def fixable(job, session):
        if outcome["fail"]:
            raise RuntimeError("bug")
        return "fixed"

    job_id = app.enqueue(None, "fixable", {}, queue="q")
    backend.run_worker(app, queues=["q"])
    listed = app.dead_jobs()
    assert [j["id"] for j in listed] == [job_id]
    assert app.dead_jobs(queue="other") == []

    outcome["fail"] = False
    assert app.requeue_dead([job_id, 999999]) == [job_id]
    job = app.get_job(job_id)
    assert (job["status"], job["attempt"], job["previous_status"]) == ("available", 0, "dead")
    assert job["previous_message"].startswith("RuntimeError: bug")
    backend.run_worker(app, queues=["q"])
    assert app.get_job(job_id)["status"] == "succeeded"
    assert app.dead_jobs() == []
    assert app.requeue_dead([job_id]) == []  # no longer dead


def test_stats_count_by_queue_and_status(backend):
    app = backend.app(retry_base_interval=0.01)

    @app.task("ok")
    def ok(job, session):
        return None

    @app.task("boom", max_attempts=1)
    def boom(job, session):
        raise RuntimeError("x")

    app.enqueue(None, "ok", {}, queue="a")
    app.enqueue(None, "boom", {}, queue="a")
    app.enqueue(None, "ok", {}, queue="b", delay=3600)
    app.enqueue(None, "ok", {}, queue="b")
    backend.run_worker(app, queues=["a"])
    stats = {s.queue: s for s in app.stats()}
    assert stats["a"].counts == {"succeeded": 1, "dead": 1}
    assert stats["a"].oldest_runnable_age is None
    assert stats["b"].counts == {"available": 2}
    assert stats["b"].scheduled == 1
    assert stats["b"].oldest_runnable_age is not None and stats["b"].oldest_runnable_age >= 0

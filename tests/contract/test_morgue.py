"""The morgue (issue 15): dead jobs listed in either order with filters, requeued and deleted
by id or by filter, on every (database, strategy) pair; a requeued job runs again."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from dbqueue import ConfigurationError

#: Run in the claim's transaction and outside it, under a lease (tests/conftest.py).
BOTH_MODES = True

UTC = dt.timezone.utc


def make_dead(backend, app, specs):
    """Enqueue (task, queue) jobs whose handlers fail once then succeed, and run them dead;
    finished_at is then set in reverse id order, so the two orders differ."""
    ids = [app.enqueue(None, task, {"n": n}, queue=queue) for n, (task, queue) in enumerate(specs)]
    backend.run_worker(app, queues=["mq1", "mq2"])
    base = dt.datetime(2030, 1, 1, tzinfo=UTC)
    engine = backend.engine()
    jobs = app.tables.jobs
    try:
        with engine.begin() as conn:
            for n, job_id in enumerate(ids):
                stamp = base - dt.timedelta(minutes=n)
                conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(finished_at=stamp))
    finally:
        engine.dispose()
    return ids


def app_with_failing_tasks(backend):
    app = backend.app(max_attempts=1)
    runs: dict[int, int] = {}

    def once_then_fine(job, session):
        runs[job.id] = runs.get(job.id, 0) + 1
        if runs[job.id] == 1:
            raise RuntimeError(f"first run of {job.id}")
        return "fine"

    for name in ("m_a", "m_b"):
        app.task(name, queue="mq1")(once_then_fine)
    return app


def statuses(backend):
    return {j["id"]: j["status"] for j in backend.jobs()}


def test_dead_jobs_filters_orders_and_deletes(backend):
    app = app_with_failing_tasks(backend)
    a1, b1, a2, b2 = make_dead(
        backend, app, [("m_a", "mq1"), ("m_b", "mq1"), ("m_a", "mq2"), ("m_b", "mq2")]
    )
    alive = app.enqueue(None, "m_a", {}, queue="mq1", delay=3600)
    listed = app.dead_jobs()
    assert [j["id"] for j in listed] == [a1, b1, a2, b2]  # newest death first
    assert [j["id"] for j in app.dead_jobs(order_by="id")] == sorted([a1, b1, a2, b2])
    assert [j["id"] for j in app.dead_jobs(task="m_a", order_by="id")] == [a1, a2]
    assert [j["id"] for j in app.dead_jobs("mq2", task="m_b")] == [b2]
    assert [j["id"] for j in app.dead_jobs(limit=2, order_by="id")] == sorted([a1, b1])[:2]
    assert listed[0]["message"].startswith("RuntimeError: first run")
    with pytest.raises(ConfigurationError, match="order_by='age'"):
        app.dead_jobs(order_by="age")

    assert app.delete_dead([a1, alive, 99_999_999]) == [a1]  # only dead jobs go
    assert app.delete_dead(task="m_b", queue="mq2") == [b2]
    assert statuses(backend) == {b1: "dead", a2: "dead", alive: "available"}
    assert app.delete_dead() == sorted([b1, a2])
    assert statuses(backend) == {alive: "available"}
    with pytest.raises(ConfigurationError, match="not both"):
        app.delete_dead([alive], task="m_a")


def test_requeue_by_filter_and_by_id_runs_the_jobs_again(backend):
    app = app_with_failing_tasks(backend)
    a1, b1, a2, b2 = make_dead(
        backend, app, [("m_a", "mq1"), ("m_b", "mq1"), ("m_a", "mq2"), ("m_b", "mq2")]
    )
    assert app.requeue_dead(task="m_a") == sorted([a1, a2])
    assert app.requeue_dead(task="m_a") == []  # nothing dead left for the filter
    assert app.requeue_dead(queue="mq2") == [b2]
    assert app.requeue_dead([b1, a1, 12_345_678]) == [b1]  # a1 is no longer dead
    requeued = {j["id"]: j for j in backend.jobs()}
    for job_id in (a1, b1, a2, b2):
        job = requeued[job_id]
        assert (job["status"], job["attempt"], job["finished_at"]) == ("available", 0, None)
        assert job["previous_status"] == "dead" and job["message"] == "requeued from the dead jobs"
    backend.run_worker(app, queues=["mq1", "mq2"])
    done = {j["id"]: (j["status"], j["attempt"], j["result"]) for j in backend.jobs()}
    assert done == {i: ("succeeded", 1, "fine") for i in (a1, b1, a2, b2)}
    assert app.dead_jobs() == []

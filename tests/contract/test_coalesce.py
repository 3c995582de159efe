"""Coalescing (Lowkiq): ``@app.task(..., coalesce=True)`` — enqueues with the same key while a
job of that key waits merge into it; ``job.payloads`` lists the merged payloads by score.

The seed's merge rules, each tested: new + waiting (the waiting job keeps its run_at and attempt),
a failed attempt + the payloads enqueued while it ran (they merge into the retry), a dead job
requeued while another waits (merged into it, which runs now from attempt 1), and what a dead
coalesced job keeps (all its payloads).
"""

from __future__ import annotations

import json
import threading

import pytest
import sqlalchemy as sa
from support.backends import effects

import dbqueue

#: Run in the claim's transaction and outside it, under a lease (tests/conftest.py).
BOTH_MODES = True

pytestmark = pytest.mark.slow


def recording_app(backend, **options):
    """An App whose coalescing task ``sync`` records each run's payloads (and payload)."""
    app = backend.app(**options)

    @app.task("sync", coalesce=True, max_attempts=options.get("max_attempts"))
    def sync(job, session):
        note = json.dumps({"payloads": job.payloads, "payload": job.payload})
        session.execute(effects.insert().values(job_id=job.id * 10 + job.attempt, note=note))
        if job.payload.get("fail"):
            raise RuntimeError("failing as asked")

    return app


def runs(backend) -> list[dict]:
    engine = backend.engine()
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(effects.c.note).order_by(effects.c.job_id))
            return [json.loads(note) for note in rows.scalars()]
    finally:
        engine.dispose()


def test_enqueues_merge_into_the_waiting_job_by_score(database):
    app = recording_app(database)
    first = app.enqueue(None, "sync", {"v": 1}, key="order:1", score=1)
    before = app.get_job(first)
    same = [
        app.enqueue(None, "sync", {"v": 3}, key="order:1", score=4),
        app.enqueue(None, "sync", {"v": 2}, key="order:1", score=2, delay=3600),
        app.enqueue(None, "sync", {"v": 2}, key="order:1", score=3),  # equal: keeps score 2
        app.enqueue(None, "sync", {"v": 0}, key="order:1", score=0.5),
    ]
    assert same == [first] * 4
    other = app.enqueue(None, "sync", {"v": 9}, key="order:2")  # another key: its own job
    assert other != first
    job = app.get_job(first)
    assert job["scored_payloads"] == [[0.5, {"v": 0}], [1, {"v": 1}], [2, {"v": 2}], [4, {"v": 3}]]
    assert job["run_at"] == before["run_at"]  # the waiting job's run_at stays (no delay)
    database.drain(app)
    assert runs(database) == [
        {"payloads": [{"v": 0}, {"v": 1}, {"v": 2}, {"v": 3}], "payload": {"v": 3}},
        {"payloads": [{"v": 9}], "payload": {"v": 9}},
    ]
    # The key is free once its job finished: the next enqueue makes a new job.
    assert app.enqueue(None, "sync", {"v": 4}, key="order:1") not in (first, other)
    with pytest.raises(dbqueue.ConfigurationError, match="score orders the payloads"):
        app.enqueue(None, "sync", {"v": 1}, score=1)  # no key: nothing to coalesce


def test_a_failed_attempt_takes_the_payloads_enqueued_while_it_ran(database):
    """Lowkiq: "an error occurred while a job of the same id was added" — the payloads merge
    into the failed job, which keeps its own run_at and attempt count."""
    app = database.app(max_attempts=3)
    started, release = threading.Event(), threading.Event()

    @app.task("sync", coalesce=True)
    def sync(job, session):
        note = json.dumps({"payloads": job.payloads, "attempt": job.attempt})
        session.execute(effects.insert().values(job_id=job.id * 10 + job.attempt, note=note))
        if job.attempt == 1:
            started.set()
            release.wait(30)
            raise RuntimeError("the first attempt fails")

    first = app.enqueue(None, "sync", {"v": 1}, key="doc", score=1)
    worker = threading.Thread(target=lambda: database.drain(app))
    worker.start()
    try:
        assert started.wait(30)
        if database.single_writer:  # the running job holds the one write lock
            later = []
        else:
            later = [app.enqueue(None, "sync", {"v": v}, key="doc", score=v) for v in (2, 3)]
            assert len(set(later)) == 1 and later[0] != first  # one follow-up
    finally:
        release.set()
        worker.join(60)
    assert not worker.is_alive()
    job = app.get_job(first)
    assert job["status"] == "succeeded" and job["attempt"] == 2
    if later:
        assert app.get_job(later[0]) is None  # merged into the retry
        # (the failed attempt's own write rolled back with it)
        assert runs(database) == [{"payloads": [{"v": 1}, {"v": 2}, {"v": 3}], "attempt": 2}]


def test_a_dead_coalesced_job_keeps_its_payloads_and_requeued_merges_into_the_waiting_one(
    database,
):
    app = recording_app(database, max_attempts=1)
    dead = app.enqueue(None, "sync", {"v": 1, "fail": True}, key="k", score=1)
    app.enqueue(None, "sync", {"v": 2}, key="k", score=2)
    app.enqueue(None, "sync", {"v": 3, "fail": True}, key="k", score=3)  # the newest fails
    database.drain(app)
    job = app.get_job(dead)
    assert job["status"] == "dead"
    assert [p["v"] for _, p in job["scored_payloads"]] == [1, 2, 3]  # nothing dropped
    waiting = app.enqueue(None, "sync", {"v": 4}, key="k", score=4)
    assert waiting != dead
    assert app.requeue_dead([dead]) == []  # merged instead of requeued
    gone = app.get_job(dead)
    assert gone["status"] == "cancelled" and f"merged into job {waiting}" in gone["message"]
    job = app.get_job(waiting)
    assert [p["v"] for _, p in job["scored_payloads"]] == [1, 2, 3, 4]
    assert job["attempt"] == 0 and job["payload"] == {"v": 4}

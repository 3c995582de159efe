"""Transactional consumption, on every backend: a job leaves the queue only when fully consumed."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from support.backends import PREFIX, effects
from support.handlers import KINDS, handler

import dbqueue


def write_effect(session, job, note="ok"):
    session.execute(effects.insert().values(job_id=job.id, note=note))


@KINDS
def test_handler_writes_commit_if_and_only_if_the_job_succeeds(backend, kind):
    app = backend.app(max_attempts=1)

    @app.task("good")
    @handler(kind)
    def good(job, session):
        write_effect(session, job)
        return "fine"

    @app.task("bad")
    @handler(kind)
    def bad(job, session):
        write_effect(session, job)
        raise RuntimeError("handler failed after writing")

    good_id = app.enqueue(None, "good", {})
    bad_id = app.enqueue(None, "bad", {})
    summary = backend.run_worker(app)
    assert (summary.succeeded, summary.failed) == (1, 1)
    assert backend.effect_ids() == [good_id]
    jobs = {j["id"]: j for j in backend.jobs()}
    assert jobs[good_id]["status"] == "succeeded" and jobs[good_id]["result"] == "fine"
    assert jobs[good_id]["message"] is None
    assert jobs[good_id]["finished_at"] is not None and jobs[good_id]["started_at"] is not None
    assert jobs[bad_id]["status"] == "dead"
    assert jobs[bad_id]["message"].startswith("RuntimeError: handler failed after writing")


def test_handler_receives_the_job(backend):
    app = backend.app()
    seen = {}

    @app.task("inspect", queue="q1")
    def inspect(job: dbqueue.Job, session):
        seen.update(
            id=job.id,
            task=job.task,
            payload=job.payload,
            attempt=job.attempt,
            tenant=job.tenant,
            key=job.external_key,
            group=job["grupo_empresarial"],  # the seed's key names work too
        )
        assert isinstance(session, dbqueue.JobSession)

    job_id = app.enqueue(
        None, "inspect", {"x": [1]}, tenant=3, external_key="k", business_group="g"
    )
    backend.run_worker(app, queues=["q1"])
    assert seen == {
        "id": job_id,
        "task": "inspect",
        "payload": {"x": [1]},
        "attempt": 1,
        "tenant": 3,
        "key": "k",
        "group": "g",
    }


@KINDS
def test_a_failing_job_in_a_batch_rolls_back_only_its_own_writes(backend, kind):
    app = backend.app(max_attempts=1)

    @app.task("mixed")
    @handler(kind)
    def mixed(job, session):
        write_effect(session, job)
        if job.payload["fail"]:
            raise ValueError("this one fails")

    ids = app.enqueue_many(
        None, [{"task": "mixed", "payload": {"fail": i % 3 == 1}} for i in range(9)]
    )
    ids = ids or [j["id"] for j in backend.jobs()]
    summary = backend.run_worker(app, batch_size=10)
    assert (summary.succeeded, summary.failed) == (6, 3)
    expected = [job_id for i, job_id in enumerate(ids) if i % 3 != 1]
    assert backend.effect_ids() == expected


def test_handler_cannot_commit_the_job_transaction_early(backend):
    app = backend.app(max_attempts=1, transaction=True)  # the leased mode's commit is its own

    @app.task("commits")
    def commits(job, session):
        write_effect(session, job, "first")
        session.commit()  # only flushes: the job's transaction is dbqueue's
        with session.begin():  # likewise
            session.execute(effects.insert().values(job_id=job.id + 100000, note="second"))
        raise RuntimeError("fails after 'committing'")

    app.enqueue(None, "commits", {})
    backend.run_worker(app)
    assert backend.effect_ids() == []


class Base(DeclarativeBase):
    pass


class Invoice(Base):
    __tablename__ = f"{PREFIX}invoices"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    amount: Mapped[int]


def test_orm_objects_added_by_the_handler_commit_with_the_job(backend):
    engine = backend.engine()
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    try:
        app = backend.app(max_attempts=1)

        @app.task("invoice")
        def invoice(job, session):
            session.add(Invoice(id=job.payload["id"], amount=job.payload["amount"]))
            if job.payload["amount"] < 0:
                raise ValueError("negative amount")
            return f"invoice {job.payload['id']}"

        app.enqueue(None, "invoice", {"id": 1, "amount": 10})
        app.enqueue(None, "invoice", {"id": 2, "amount": -5})
        backend.run_worker(app)
        with engine.connect() as conn:
            rows = conn.execute(sa.select(Invoice.__table__.c.id)).scalars().all()
        assert rows == [1]
    finally:
        Base.metadata.drop_all(engine)
        engine.dispose()


def test_claim_order_is_priority_then_run_at_then_id(backend):
    app = backend.app()
    order = []

    @app.task("ordered")
    def ordered(job, session):
        order.append(job.payload)

    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    app.enqueue(None, "ordered", "p50-late")
    app.enqueue(None, "ordered", "p50-early", run_at=past)
    app.enqueue(None, "ordered", "p10-a", priority=10)
    app.enqueue(None, "ordered", "p10-b", priority=10)
    app.enqueue(None, "ordered", "p90", priority=90)
    app.enqueue(None, "ordered", "p1", priority=1)
    backend.run_worker(app, batch_size=1)
    assert order == ["p1", "p10-a", "p10-b", "p50-early", "p50-late", "p90"]


def test_delayed_job_waits_for_its_time(backend):
    app = backend.app()
    ran = []

    @app.task("later")
    def later(job, session):
        ran.append(job.id)

    job_id = app.enqueue(None, "later", {}, delay=3600)
    now_id = app.enqueue(None, "later", {})
    backend.run_worker(app)
    assert ran == [now_id]
    assert app.get_job(job_id)["status"] == "available"
    # Move it to the past as an operator would with plain SQL; then it runs.
    with app.engine.begin() as conn:
        jobs = app.tables.jobs
        conn.execute(jobs.update().where(jobs.c.id == job_id).values(run_at=jobs.c.created_at))
    backend.run_worker(app)
    assert ran == [now_id, job_id]


def test_worker_consumes_only_its_queues(backend):
    app = backend.app()
    ran = []

    @app.task("any")
    def handler(job, session):
        ran.append(job.queue)

    app.enqueue(None, "any", {}, queue="a")
    b_id = app.enqueue(None, "any", {}, queue="b")
    backend.run_worker(app, queues=["a"])
    assert ran == ["a"]
    assert app.get_job(b_id)["status"] == "available"
    backend.run_worker(app, queues=["a", "b"])
    assert ran == ["a", "b"]


def test_default_queues_are_the_registered_tasks_queues(backend):
    app = backend.app()
    ran = []

    @app.task("mail", queue="mail")
    def mail(job, session):
        ran.append("mail")

    @app.task("plain")
    def plain(job, session):
        ran.append("plain")

    app.enqueue(None, "mail", {})
    app.enqueue(None, "plain", {})
    backend.run_worker(app)
    assert sorted(ran) == ["mail", "plain"]


def test_unknown_task_is_a_recorded_failure_not_a_crash(backend):
    app = backend.app(retry_base_interval=60)  # the retry is not due while this worker runs
    ran = []

    @app.task("known")
    def known(job, session):
        ran.append(job.id)

    unknown_id = app.enqueue(None, "nobody_handles_this", {"x": 1}, max_attempts=2)
    known_id = app.enqueue(None, "known", {})
    summary = backend.run_worker(app)
    assert ran == [known_id]
    job = app.get_job(unknown_id)
    assert job["attempt"] == 1 and job["status"] == "available"
    assert "unknown task 'nobody_handles_this'" in job["message"]
    assert "@app.task('nobody_handles_this')" in job["message"]  # says how to fix it
    assert job["run_at"] > job["previous_attempt_at"]  # retried later, by the usual rules
    assert summary.failed == 1


def test_concurrency_threads_share_the_work(backend):
    app = backend.app()

    @app.task("effect")
    def effect(job, session):
        write_effect(session, job)

    ids = app.enqueue_many(None, [{"task": "effect", "payload": i} for i in range(60)])
    summary = backend.run_worker(app, concurrency=3, batch_size=5)
    assert summary.succeeded == 60
    assert len(backend.effect_ids()) == 60
    if ids:
        assert backend.effect_ids() == sorted(ids)
    assert all(j["status"] == "succeeded" and j["attempt"] == 1 for j in backend.jobs())

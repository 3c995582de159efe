"""Eager mode on every backend: jobs run in the enqueuing process when their transaction commits
(never on rollback), with the worker's retries, dead handlers and records, and without a worker.

The App gets the backend's claim strategy, which eager mode claims with: the last test runs a
real worker beside it and proves that no job runs twice.
"""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from support.backends import effect_rows, effects
from support.waiting import wait_for

import dbqueue


def eager_app(backend, **options) -> dbqueue.App:
    return backend.app(eager=True, **options).reconfigured(strategy=backend.strategy)


def note_task(app: dbqueue.App, ran: list[int]) -> None:
    @app.task("note")
    def note(job, session):
        ran.append(job.id)
        session.execute(effects.insert().values(job_id=job.id, note=str(job.payload)))


def statuses(backend) -> dict[int, tuple[str, int]]:
    return {j["id"]: (j["status"], j["attempt"]) for j in backend.jobs()}


def test_jobs_run_when_the_session_or_connection_commits_and_never_on_rollback(backend):
    app = eager_app(backend)
    ran: list[int] = []
    note_task(app, ran)
    engine = backend.engine()
    try:
        with Session(engine) as session, session.begin():
            first = app.enqueue(session, "note", {"n": 1}, delay=3600)  # delays do not wait
            with session.begin_nested():
                (nested,) = app.enqueue_many(session, [{"task": "note", "payload": {"n": 2}}])
            assert ran == []  # not before the outermost commit, not at the SAVEPOINT's release
        assert ran == [first, nested]
        with Session(engine) as session:
            app.enqueue(session, "note", {"n": 3})
            session.rollback()
            with session.begin():  # the same Session's next transaction runs only its own jobs
                third = app.enqueue(session, "note", {"n": 4})
        assert ran == [first, nested, third]

        with engine.connect() as conn:
            fourth = app.enqueue(conn, "note", {"n": 5})  # no begin(): the Connection's own
            assert ran[3:] == []
            conn.commit()
            assert ran[3:] == [fourth]
            app.enqueue(conn, "note", {"n": 6})
            conn.rollback()
            with conn.begin():
                fifth = app.enqueue(conn, "note", {"n": 7})
                assert ran[3:] == [fourth]
        assert ran[3:] == [fourth, fifth]
    finally:
        engine.dispose()
    ids = [first, nested, third, fourth, fifth]
    assert [j["payload"] for j in backend.jobs()] == [{"n": n} for n in (1, 2, 4, 5, 7)]
    assert statuses(backend) == {i: ("succeeded", 1) for i in ids}
    assert backend.effect_ids() == ids


def test_what_runs_at_once_and_what_is_left_for_a_worker(backend):
    """Without a transaction (None, an Engine) a job runs before enqueue returns; the jobs a
    handler enqueues run after it committed; pub/sub deliveries run; a job whose code is not
    in this process (another service's) is left for a worker."""
    app = eager_app(backend)
    app.add_subscription(None, "index", "order.paid")
    app.add_subscription(None, "elsewhere", "order.paid")
    order: list[tuple[str, int]] = []
    seen_parent: list[str] = []

    @app.task("parent")
    def parent(job, session):
        order.append(("parent", job.id))
        app.enqueue(session, "child", {"parent": job.id})  # commits with this job
        session.execute(effects.insert().values(job_id=job.id, note="parent"))
        assert order == [("parent", job.id)]  # the child waits for this job

    @app.task("child")
    def child(job, session):
        order.append(("child", job.id))
        seen_parent.append(app.get_job(job.payload["parent"])["status"])

    @app.subscriber("order.paid", "index")
    def update_index(job, session):
        order.append(("index", job.id))
        session.execute(effects.insert().values(job_id=job.id, note="indexed"))

    parent_id = app.enqueue(None, "parent")
    assert [name for name, _ in order] == ["parent", "child"]
    assert seen_parent == ["succeeded"]  # the child ran after the parent had committed
    publication = app.publish(app.engine, "order.paid", {"order": 42})
    unknown = app.enqueue(app.engine, "not_here")
    live = backend.deliveries(publication)
    assert order[2:] == [("index", live["index"]["id"])]
    jobs = statuses(backend)
    assert jobs.pop(live["elsewhere"]["id"]) == jobs.pop(unknown) == ("available", 0)
    assert jobs.pop(publication) == ("succeeded", 0)  # the publication's own record
    assert set(jobs.values()) == {("succeeded", 1)}
    assert backend.effect_ids() == [parent_id, live["index"]["id"]]


def test_retries_run_at_once_then_the_job_dies_and_its_dead_handler_runs(backend):
    app = eager_app(backend, retry_base_interval=3600)  # a worker would wait an hour
    attempts: list[tuple[int, int]] = []
    dead_runs: list[tuple] = []

    @app.task("charge", max_attempts=3)
    def charge(job, session):
        attempts.append((job.payload["order"], job.attempt))
        session.execute(effects.insert().values(job_id=job.id, note=f"attempt {job.attempt}"))
        if job.attempt < job.payload["succeed_at"]:  # its write rolls back with the attempt
            raise RuntimeError(f"card declined (attempt {job.attempt})")

    @app.dead_handler("charge")
    def charge_dead(job, session):
        dead_runs.append((job.live_id, job.dead, job.payload["order"]))
        session.execute(effects.insert().values(job_id=job.id, note="refunded"))

    flaky = app.enqueue(None, "charge", {"order": 1, "succeed_at": 3})
    doomed = app.enqueue(None, "charge", {"order": 2, "succeed_at": 99})
    assert attempts == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]
    job = app.get_job(flaky)
    assert (job["status"], job["attempt"], job["previous_status"]) == ("succeeded", 3, "failed")
    assert job["previous_message"].startswith("RuntimeError: card declined (attempt 2)")
    assert "Traceback" in job["previous_message"]
    assert job["first_attempt_at"] <= job["previous_attempt_at"] <= job["started_at"]
    job = app.get_job(doomed)
    assert (job["status"], job["attempt"]) == ("dead", 3)
    assert job["message"].startswith("RuntimeError: card declined (attempt 3)")
    assert dead_runs == [(doomed, True, 2)]
    (letter,) = [j for j in backend.jobs() if j["dead"]]
    assert (letter["live_id"], letter["status"], letter["attempt"]) == (doomed, "succeeded", 1)
    jobs = app.tables.jobs
    with app.engine.connect() as conn:  # the README's monitoring query
        ran_eagerly = conn.execute(
            sa.select(jobs.c.id).where(jobs.c.worker_id.like("%:eager:%")).order_by(jobs.c.id)
        ).scalars()
        assert list(ran_eagerly) == [flaky, doomed, letter["id"]]
    assert effect_rows(backend, "job_id", "note") == [
        (flaky, "attempt 3"),
        (letter["id"], "refunded"),
    ]

    # eager_raise: the caller hears of it, once committed and the dead handler has run.
    raising = app.reconfigured(eager_raise=True)
    with Session(app.engine) as session:
        with pytest.raises(dbqueue.EagerJobError) as raised, session.begin():
            second = raising.enqueue(session, "charge", {"order": 3, "succeed_at": 99})
        session.execute(sa.select(1))  # the Session is still usable
    assert str(raised.value).splitlines()[0] == (
        f"eager mode: job {second} (charge) is dead after 3 attempt(s): "
        "RuntimeError: card declined (attempt 3)"
    )
    assert [f["id"] for f in raised.value.failures] == [second]
    assert app.get_job(second)["status"] == "dead"
    assert dead_runs[-1] == (second, True, 3)


def test_a_worker_beside_eager_mode_never_runs_a_job_twice(backend):
    """The worker (a plain App on the same tables) polls while eager mode runs each job at its
    commit: whichever claims a job first runs it, once."""
    eager, plain = eager_app(backend), backend.app()
    for app in (eager, plain):

        @app.task("once")
        def once(job, session):  # a second run would hit the primary key and fail
            session.execute(effects.insert().values(job_id=job.id, note="ran"))

    worker = plain.worker(
        strategy=backend.strategy,
        poll_interval=0.01,
        min_poll_interval=0.01,
        install_signal_handlers=False,
        maintenance=False,
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        ids = [eager.enqueue(None, "once", {"n": n}) for n in range(6)]
        # A job the worker held a lock on when eager mode tried it is the worker's to run.
        wait_for(
            lambda: {s for s, _ in statuses(backend).values()} == {"succeeded"}, 20, "the jobs"
        )
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert statuses(backend) == {i: ("succeeded", 1) for i in ids}
    assert backend.effect_ids() == ids


def test_dbqueue_eager_turns_it_on(database, monkeypatch):
    monkeypatch.setenv("DBQUEUE_EAGER", "true")
    engine = sa.create_engine(database.url)  # the application's own: eager mode makes its own
    try:
        app = dbqueue.App(engine, table_prefix=database.prefix, lock_server=database.server)
        ran: list[int] = []
        note_task(app, ran)
        assert app.eager
        job_id = app.enqueue(None, "note", {"n": 1})
        assert ran == [job_id] and app.get_job(job_id)["status"] == "succeeded"
    finally:
        engine.dispose()
    monkeypatch.setenv("DBQUEUE_EAGER", "false")
    assert not database.app().eager


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: dbqueue.App(environ={"DBQUEUE_EAGER": "sometimes"}),
            "DBQUEUE_EAGER='sometimes' is not a boolean: use true or false",
        ),
        (
            lambda: dbqueue.App(environ={"DBQUEUE_EAGER_RAISE": "2"}),
            "DBQUEUE_EAGER_RAISE='2' is not a boolean: use true or false",
        ),
        (lambda: dbqueue.App(eager="yes"), "eager='yes' must be True or False"),
    ],
)
def test_a_bad_eager_setting_is_one_clear_line(make, message):
    with pytest.raises(dbqueue.ConfigurationError) as raised:
        make()
    assert str(raised.value) == message

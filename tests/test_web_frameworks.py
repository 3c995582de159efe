"""Enqueueing through a web framework's session: Flask-SQLAlchemy's ``db.session`` (a
``scoped_session``), for real, on PostgreSQL, MariaDB and SQLite.

The job joins the transaction of the session that is current for the request (or app context):
it exists once the view commits, not at all when the view fails or rolls back, a worker runs it,
and this process's workers are woken after the commit, never before it.
"""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, scoped_session, sessionmaker
from support.backends import PREFIX
from support.idle_worker import IdleWorker

flask = pytest.importorskip("flask")
flask_sqlalchemy = pytest.importorskip("flask_sqlalchemy")

pytestmark = pytest.mark.parametrize("database", ["postgresql", "mysql", "sqlite"], indirect=True)

db = flask_sqlalchemy.SQLAlchemy()


class Order(db.Model):
    __tablename__ = f"{PREFIX}web_orders"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    invoiced: Mapped[bool] = mapped_column(default=False)


class WakeRecorder:
    """Stands in this process's list of workers: records each wake an enqueue sends."""

    def __init__(self) -> None:
        self.wakes: list[bool] = []

    def wake(self, early: bool = False) -> None:
        self.wakes.append(early)


@pytest.fixture
def web(database):
    """A Flask app on the backend's database with a POST /orders view that saves an order and
    enqueues its invoice through ``db.session``; ``?fail=1`` makes the view fail afterwards."""
    queue = database.app()

    @queue.task("invoice_order")
    def invoice_order(job, session):
        session.get(Order, job.payload["order"]).invoiced = True
        return f"invoiced {job.payload['order']}"

    flask_app = flask.Flask(__name__)
    flask_app.config["SQLALCHEMY_DATABASE_URI"] = database.url
    db.init_app(flask_app)

    @flask_app.post("/orders/<int:order_id>")
    def create_order(order_id: int):
        db.session.add(Order(id=order_id))
        job_id = queue.enqueue(db.session, "invoice_order", {"order": order_id}, priority=5)
        if flask.request.args.get("fail"):
            raise RuntimeError("the view failed after enqueueing")
        db.session.commit()
        return {"job": job_id}

    with flask_app.app_context():
        Order.__table__.drop(db.engine, checkfirst=True)
        Order.__table__.create(db.engine)
    flask_app.queue = queue
    yield flask_app
    with flask_app.app_context():
        db.session.remove()
        Order.__table__.drop(db.engine)
        db.engine.dispose()
    queue.engine.dispose()


def orders(flask_app) -> dict[int, bool]:
    with flask_app.app_context():
        return dict(db.session.execute(sa.select(Order.id, Order.invoiced)).all())


def test_a_committed_request_enqueues_and_a_worker_runs_the_job(web, database):
    response = web.test_client().post("/orders/42")
    assert response.status_code == 200, response.text
    job_id = response.get_json()["job"]
    (job,) = database.jobs()
    assert (job["id"], job["task"], job["priority"], job["status"]) == (
        job_id,
        "invoice_order",
        5,
        "available",
    )
    assert orders(web) == {42: False}
    summary = database.run_worker(web.queue)
    assert summary.succeeded == 1
    assert web.queue.get_job(job_id)["result"] == "invoiced 42"
    assert orders(web) == {42: True}  # the handler's write committed with the job


def test_a_failed_request_leaves_neither_the_order_nor_the_job(web, database):
    web.config["PROPAGATE_EXCEPTIONS"] = False  # a 500 response, as in production
    response = web.test_client().post("/orders/7?fail=1")
    assert response.status_code == 500
    assert database.jobs() == []
    assert orders(web) == {}


def test_rollback_in_an_app_context_drops_the_job(web, database):
    with web.app_context():
        db.session.add(Order(id=1))
        web.queue.enqueue(db.session, "invoice_order", {"order": 1})
        db.session.rollback()
        db.session.add(Order(id=2))
        kept = web.queue.enqueue(db.session, "invoice_order", {"order": 2})
        db.session.commit()
    assert [job["id"] for job in database.jobs()] == [kept]
    assert orders(web) == {2: False}


def test_workers_are_woken_after_the_commit_not_before(web, database):
    recorder = WakeRecorder()
    web.queue.context.local_workers.add(recorder)
    with web.app_context():
        web.queue.enqueue(db.session, "invoice_order", {"order": 1})
        db.session.rollback()
        web.queue.enqueue(db.session, "invoice_order", {"order": 2})
        web.queue.enqueue(db.session, "invoice_order", {"order": 3})
        assert recorder.wakes == []
        db.session.commit()
    assert recorder.wakes == [False]  # once, after the commit: the jobs are visible


def test_an_idle_worker_picks_up_a_request_job_at_once(web, database):
    """The worker polls once an hour: only the wake-up after the view's commit can reach it."""
    with IdleWorker(web.queue, database.strategy) as idle:
        with web.test_request_context(), web.app_context():
            job_id = web.queue.enqueue(db.session, "wake", {})
            db.session.commit()
        idle.wait_for(job_id)


def in_thread(work):
    """Run ``work()`` in a new thread (a scope of its own) and return what it returned."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(work()))
    thread.start()
    thread.join(30)
    assert result, "the thread failed"
    return result[0]


def test_a_scoped_session_enqueues_in_the_current_thread_session(web, database):
    """Plain SQLAlchemy ``scoped_session``: a job joins the session of the thread that
    enqueued it; another thread's commit does not commit it."""
    engine = web.queue.create_engine()
    scoped = scoped_session(sessionmaker(engine))

    def commit_and_close():
        scoped.commit()
        scoped.remove()

    def enqueue_and_commit():
        job_id = web.queue.enqueue(scoped, "invoice_order", {"order": 2})
        commit_and_close()
        return job_id

    web.queue.enqueue(scoped, "invoice_order", {"order": 1})
    in_thread(commit_and_close)  # another thread's session: commits nothing of ours
    scoped.rollback()
    kept = in_thread(enqueue_and_commit)
    scoped.remove()
    engine.dispose()
    assert [job["id"] for job in database.jobs()] == [kept]

"""A user's module calling dbqueue's public API: ``mypy --strict`` must accept it as it is."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Session, scoped_session, sessionmaker

import dbqueue

app = dbqueue.App("sqlite:///typing-check.db", table_prefix="typing_", max_attempts=3)
engine: sa.Engine = app.create_engine()


@app.task("send_invoice", queue="billing", max_attempts=5, timeout=30.0)
def send_invoice(job: dbqueue.Job, session: Session) -> str | None:
    order: int = job.payload["order"]
    attempt: int = job.attempt
    tenant: int | None = job.tenant
    created: dt.datetime | None = job.created_at
    print(job.id, job.task, job.queue, job.priority, job.external_key, created)
    session.execute(sa.text("SELECT 1"))
    return f"invoiced {order} at attempt {attempt} for {tenant}"


@app.dead_handler("send_invoice")
def invoice_died(job: dbqueue.Job, session: Session) -> None:
    assert job.dead and job.live_id is not None


@app.subscriber("order_paid", "mailer", queue="mail")
def mail_receipt(job: dbqueue.Job, session: Session) -> None:
    print(job.publication_id, job.subscription_id)


def enqueue_everywhere() -> list[int]:
    ids: list[int] = []
    with Session(engine) as session, session.begin():
        ids.append(
            app.enqueue(
                session,
                "send_invoice",
                {"order": 42},
                priority=10,
                delay=30,
                external_key="order-42",
                tenant=7,
            )
        )
    with engine.begin() as conn:
        now = dt.datetime.now(dt.timezone.utc)
        ids.append(app.enqueue(conn, "send_invoice", {"order": 43}, run_at=now))
    ids.append(app.enqueue(None, "send_invoice", delay=dt.timedelta(minutes=5), queue="billing"))
    scoped = scoped_session(sessionmaker(engine))
    ids.append(app.enqueue(scoped, "send_invoice", {"order": 44}, business_group="acme"))
    scoped.commit()
    ids += app.enqueue_many(
        None,
        [{"task": "send_invoice", "payload": {"order": n}, "priority": n} for n in range(3)],
    )
    return ids


def publish_and_subscribe() -> int:
    sub: dbqueue.Subscription = app.add_subscription(
        None, "mailer", "order_paid", tenant=7, url=None, headers={"X-Token": "t"}
    )
    print(sub.id, sub.topic, sub.active)
    return app.publish(None, "order_paid", {"order": 42}, tenant=7, max_attempts=2)


def work() -> int:
    summary: dbqueue.WorkerSummary = app.run_worker(burst=True, concurrency=2, max_jobs=10)
    worker: dbqueue.Worker = app.worker(queues=["billing"], burst=True)
    worker.stop()
    return summary.succeeded + summary.failed


def the_engine() -> sa.Engine:
    return app.engine


def configured_url() -> str | None:
    settings: dbqueue.Settings = app.settings
    return settings.url


def one_job(job_id: int) -> str | None:
    row = app.get_job(job_id)
    return None if row is None else str(row["status"])


class Invoices(dbqueue.WorkerBase):
    def execute(self, payload: object, job: dbqueue.Job, session: object) -> str | None:
        return f"{job.task} {payload}"


def seed_client(conn: sa.Connection) -> int:
    client = dbqueue.QueueClient(conn, app=app)
    return client.insert_task(None, None, "send_invoice", "order-1", {"order": 1}, prioridade=5)

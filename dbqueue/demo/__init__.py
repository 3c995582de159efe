"""A real demo on SQLite: ``python -m dbqueue.demo`` (``make demo``).

It migrates a fresh database, places an order and enqueues its jobs in the same transaction,
shows that a rolled-back transaction leaves no job, then runs a worker until the queue drains —
one job fails on its first attempt and is retried — and prints what happened.

``dbqueue.demo:app`` also serves as a ready-made ``--app`` (docker-compose's worker uses it).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dbqueue import App, Job

DEMO_DB = "dbqueue-demo.db"

business = sa.MetaData()
orders = sa.Table(
    "demo_orders",
    business,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("customer", sa.String(100), nullable=False),
    sa.Column("invoiced", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("charged", sa.Boolean, nullable=False, server_default=sa.false()),
)


def build_app(url: str | None = None, retry_base_interval: float | None = None) -> App:
    app = App(url, retry_base_interval=retry_base_interval)

    @app.task("send_invoice", queue="billing")
    def send_invoice(job: Job, session: Session) -> str:
        order_id = job.payload["order"]
        # Same transaction as the job: this update commits only if the job is marked succeeded.
        session.execute(orders.update().where(orders.c.id == order_id).values(invoiced=True))
        return f"invoiced order {order_id}"

    @app.task("charge_card", queue="billing", max_attempts=3)
    def charge_card(job: Job, session: Session) -> str:
        order_id = job.payload["order"]
        session.execute(orders.update().where(orders.c.id == order_id).values(charged=True))
        if job.attempt == 1:
            # The flag set above is rolled back with this attempt; attempt 2 sets it for good.
            raise ConnectionError("payment gateway timed out")
        return f"charged order {order_id} on attempt {job.attempt}"

    @app.task("send_email", priority=10)
    def send_email(job: Job, session: Session) -> str:
        return f"emailed {job.payload['to']}"

    return app


app = build_app()


def _print_jobs(demo: App) -> None:
    jobs = demo.tables.jobs
    with demo.engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                jobs.c.id,
                jobs.c.queue,
                jobs.c.task,
                jobs.c.status,
                jobs.c.attempt,
                jobs.c.previous_message,
                jobs.c.message,
                jobs.c.result,
            ).order_by(jobs.c.id)
        ).all()
    print(f"\n{'id':>3}  {'queue':8} {'task':13} {'status':10} {'attempts':8}  result / message")
    for row in rows:
        outcome = json.dumps(row.result) if row.result is not None else (row.message or "")
        print(
            f"{row.id:>3}  {row.queue:8} {row.task:13} {row.status:10} {row.attempt:>8}  "
            f"{outcome.splitlines()[0] if outcome else ''}"
        )
        if row.previous_message:
            print(f"{'':47}earlier attempt: {row.previous_message.splitlines()[0]}")


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="  [worker] %(message)s")
    path = Path(os.environ.get("DBQUEUE_DEMO_DB", DEMO_DB))
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    demo = build_app(f"sqlite:///{path}", retry_base_interval=1.0)

    print(f"1. migrate a fresh SQLite database: {path}")
    demo.migrate()
    business.create_all(demo.engine)

    print("2. one transaction: place order 1 and enqueue its three jobs")
    with Session(demo.engine) as session, session.begin():
        session.execute(orders.insert().values(id=1, customer="Ada"))
        demo.enqueue(session, "send_invoice", {"order": 1})
        demo.enqueue(session, "charge_card", {"order": 1})
        demo.enqueue(session, "send_email", {"to": "ada@example.com"})

    print("3. another transaction enqueues a job, then rolls back: no job is left behind")
    with Session(demo.engine) as session:
        session.begin()
        session.execute(orders.insert().values(id=2, customer="Bob"))
        demo.enqueue(session, "send_invoice", {"order": 2})
        session.rollback()
    total = sum(sum(s.counts.values()) for s in demo.stats())
    print(f"   jobs in the queue: {total} (the rolled-back one is not there)")

    print("4. run a worker until the queue drains (charge_card fails once, retries after 1 s)")
    started = time.monotonic()
    while any(s.counts.get("available") or s.counts.get("running") for s in demo.stats()):
        demo.run_worker(
            queues=["default", "billing"],
            concurrency=2,
            burst=True,
            poll_interval=0.1,
            install_signal_handlers=False,
        )
        time.sleep(0.2)
    print(f"   drained in {time.monotonic() - started:.1f} s")

    print("5. what happened")
    _print_jobs(demo)
    with demo.engine.connect() as conn:
        order = conn.execute(sa.select(orders).where(orders.c.id == 1)).one()
        others = conn.execute(sa.select(sa.func.count()).select_from(orders)).scalar_one()
    print(f"\norder 1: invoiced={order.invoiced} charged={order.charged}; orders stored: {others}")
    print(f"try: .venv/bin/dbqueue stats --url sqlite:///{path}")
    demo.engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Mistakes ``mypy --strict`` must report, each on the line that carries its ``# error:`` code
(tests/test_typing.py checks that exactly these are reported: proof that the check checks)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import dbqueue

app = dbqueue.App("sqlite:///typing-check.db")


@app.task("send_invoice")
def send_invoice(job: dbqueue.Job, session: Session) -> str:
    return str(job.attempts)  # error: [attr-defined]


def mistakes(engine: sa.Engine) -> None:
    app.enqueue(None, "send_invoice", priority="high")  # error: [arg-type]
    app.enqueue(None, "send_invoice", prio=1)  # error: [call-arg]
    app.enqueue(sessionmaker(engine), "send_invoice")  # error: [arg-type]
    app.publish(None, "order_paid", {"order": 1}, delay="soon")  # error: [arg-type]
    send_invoice("not a job")  # error: [call-arg, arg-type]
    tenant: int = app.get_job(1)  # error: [assignment]
    print(tenant)

"""Every failed attempt's error is kept in ``jobs.errors``, on every backend: one entry per
attempt, in order, stamped by the database's clock, its traceback the handler's own frames."""

from __future__ import annotations

import datetime as dt

from support.handlers import KINDS, handler

from dbqueue.engine import catalog

#: Where the machinery's frames come from; none may appear in a stored traceback.
MACHINERY_PATHS = ("/dbqueue/", "/sqlalchemy/", "/greenlet/", "/concurrent/futures/", "/asyncio/")


def charge(attempt: int) -> None:
    try:
        {}["card"]
    except KeyError as exc:
        raise ValueError(f"card declined (attempt {attempt})") from exc


def at(entry: dict) -> dt.datetime:
    return dt.datetime.fromisoformat(entry["at"].replace("Z", "+00:00"))


@KINDS
def test_three_failed_attempts_are_three_entries_with_the_handlers_frames(backend, kind):
    app = backend.app(backoff=lambda attempt: 0)

    @app.task("declined", max_attempts=3)
    @handler(kind)
    def declined_card(job, session):
        charge(job.attempt)

    job_id = app.enqueue(None, "declined", {})
    backend.drain(app)
    job = app.get_job(job_id)
    assert (job["status"], job["attempt"]) == ("dead", 3)
    errors = job["errors"]
    assert [e["attempt"] for e in errors] == [1, 2, 3]
    assert [e["message"] for e in errors] == [
        f"ValueError: card declined (attempt {n})" for n in (1, 2, 3)
    ]
    for entry in errors:
        trace = entry["traceback"]
        assert "in declined_card" in trace and "in charge" in trace
        assert "KeyError: 'card'" in trace and "direct cause of the following" in trace
        assert trace.endswith(f"ValueError: card declined (attempt {entry['attempt']})")
        assert not [line for line in trace.splitlines() if any(p in line for p in MACHINERY_PATHS)]
    # The database's clock: in order, and the last one is the statement that recorded it.
    stamps = [at(e) for e in errors]
    assert stamps == sorted(stamps)
    assert abs((stamps[-1] - job["updated_at"]).total_seconds()) < 0.001
    # The documented columns keep what they held: the last error, with its full traceback.
    assert job["message"].startswith("ValueError: card declined (attempt 3)\nTraceback")
    assert job["previous_message"] == job["message"]


def test_failures_without_a_traceback_are_entries_of_their_message(backend):
    app = backend.app(backoff=lambda attempt: 0)
    job_id = app.enqueue(None, "nobody_handles_this", {}, max_attempts=2)
    backend.drain(app)
    errors = app.get_job(job_id)["errors"]
    assert [(e["attempt"], e["traceback"]) for e in errors] == [(1, None), (2, None)]
    assert all("nobody_handles_this" in e["message"] for e in errors)


def test_the_list_keeps_the_newest_entries(backend, monkeypatch):
    monkeypatch.setattr(catalog, "MAX_KEPT_ERRORS", 3)
    app = backend.app(backoff=lambda attempt: 0)

    @app.task("always", max_attempts=5)
    def always(job, session):
        raise RuntimeError(f"no {job.attempt}")

    job_id = app.enqueue(None, "always", {})
    backend.drain(app)
    errors = app.get_job(job_id)["errors"]
    assert [(e["attempt"], e["message"]) for e in errors] == [
        (n, f"RuntimeError: no {n}") for n in (3, 4, 5)
    ]


def test_jobs_enqueued_by_the_app_carry_its_max_attempts_and_plain_sql_the_columns(backend):
    app = backend.app(retry_base_interval=None)
    jobs = app.tables.jobs
    job_id = app.enqueue(None, "t", {})
    with app.engine.begin() as conn:
        plain = conn.execute(jobs.insert().values(task="t", payload={})).inserted_primary_key[0]
    assert app.max_attempts == 20
    assert app.get_job(job_id)["max_attempts"] == 20
    assert app.get_job(plain)["max_attempts"] == 100  # the column's server default
    assert app.get_job(job_id)["errors"] is None

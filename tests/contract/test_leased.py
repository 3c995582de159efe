"""Jobs run outside their claim's transaction (``transaction=False``), on every (database,
strategy) pair: committed as running under a lease, their handler's session its own, their
outcome fenced by worker and attempt, a lost worker's job rescued once its lease ended."""

from __future__ import annotations

import datetime as dt
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from support.backends import Backend, effects

import dbqueue

#: Bounds a wait that only a broken mode would reach: the test fails instead of hanging.
DEADLOCK_BOUND = 60.0


def elsewhere(backend: Backend, work: Callable[[sa.Connection], Any]) -> Any:
    """Run ``work`` in a transaction of another connection, from another thread. Were the
    worker holding the job's row lock or the database's write lock, it would wait for the
    handler that waits for it: bounded, to fail instead of hanging."""
    engine = backend.engine()
    found: dict[str, Any] = {}

    def run() -> None:
        try:
            with engine.begin() as conn:
                found["value"] = work(conn)
        except BaseException as exc:
            found["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLOCK_BOUND)
    assert not thread.is_alive(), "another connection waited for the worker's locks"
    engine.dispose()
    if "error" in found:
        raise found["error"]
    return found.get("value")


def row_of(backend: Backend, job_id: int) -> dict[str, Any]:
    return next(job for job in backend.jobs() if job["id"] == job_id)


def test_a_leased_job_is_committed_running_and_holds_no_lock_while_it_runs(backend):
    app = backend.app(transaction=False)
    jobs = app.tables.jobs
    seen: dict[str, Any] = {}

    @app.task("long")
    def long(job, session):
        def look(conn: sa.Connection) -> None:
            columns = (jobs.c.status, jobs.c.worker_id, jobs.c.attempt)
            row = conn.execute(sa.select(*columns).where(jobs.c.id == job.id)).one()
            seen["row"] = tuple(row)
            lease = conn.execute(
                sa.select(jobs.c.lease_until > jobs.c.started_at).where(jobs.c.id == job.id)
            )
            seen["leased"] = bool(lease.scalar_one())
            # What a claim held in a transaction would block: the job's row, and a new job.
            conn.execute(jobs.update().where(jobs.c.id == job.id).values(external_key="seen"))
            seen["enqueued"] = app.enqueue(conn, "other", {})

        elsewhere(backend, look)

    job_id = app.enqueue(None, "long", {})
    summary = backend.run_worker(app, queues=["default"], max_jobs=1)
    assert summary.succeeded == 1
    status, worker_id, attempt = seen["row"]
    assert (status, attempt) == ("running", 1) and worker_id
    assert seen["leased"] is True
    done = row_of(backend, job_id)
    assert (done["status"], done["attempt"], done["external_key"]) == ("succeeded", 1, "seen")
    assert row_of(backend, seen["enqueued"])["status"] == "available"


def test_a_leased_handler_commits_its_own_work_and_the_rest_goes_with_its_outcome(backend):
    app = backend.app(transaction=False, max_attempts=2)

    @app.task("steps")
    def steps(job, session):
        step = job.id * 100 + job.attempt * 10  # effects are keyed by a number of their own
        session.execute(effects.insert().values(job_id=step, note=f"committed {job.attempt}"))
        session.commit()  # its own transaction: this survives whatever follows
        session.execute(effects.insert().values(job_id=step + 1, note=f"pending {job.attempt}"))
        if job.attempt == 1:
            raise RuntimeError("failed after its first step")
        return "done"

    job_id = app.enqueue(None, "steps", {})
    backend.drain(app)
    engine = backend.engine()
    with engine.connect() as conn:
        notes = sorted(conn.execute(sa.select(effects.c.note)).scalars())
    engine.dispose()
    assert notes == ["committed 1", "committed 2", "pending 2"]
    done = row_of(backend, job_id)
    assert (done["status"], done["attempt"], done["result"]) == ("succeeded", 2, "done")


def test_an_outcome_after_the_lease_ended_changes_nothing(backend, caplog):
    app = backend.app(transaction=False)
    jobs = app.tables.jobs

    @app.task("overtaken")
    def overtaken(job, session):
        # Its lease ended, rescue retried it and another worker claimed it (as they would).
        taken = jobs.update().where(jobs.c.id == job.id)
        taken = taken.values(worker_id="someone-else:0", attempt=jobs.c.attempt + 1)
        elsewhere(backend, lambda conn: conn.execute(taken))
        return "done here"

    job_id = app.enqueue(None, "overtaken", {})
    with caplog.at_level(logging.WARNING, logger="dbqueue.worker"):
        summary = backend.run_worker(app, max_jobs=1)
    assert summary.succeeded == 0
    row = row_of(backend, job_id)
    assert (row["status"], row["worker_id"], row["attempt"]) == ("running", "someone-else:0", 2)
    assert row["result"] is None
    assert "their lease ended before they finished" in caplog.text


def _left_by_a_dead_worker(backend: Backend, app: dbqueue.App, task: str, lease: dt.datetime):
    """A job as a worker that died while running it leaves it: running, its lease ``lease``."""
    jobs = app.tables.jobs
    job_id = app.enqueue(None, task, {})
    past = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
    marked = {"status": "running", "attempt": 1, "worker_id": "dead:0", "started_at": past}
    with backend.engine().begin() as conn:
        conn.execute(jobs.update().where(jobs.c.id == job_id).values(lease_until=lease, **marked))
    return job_id


def test_rescue_retries_a_job_whose_lease_ended_and_leaves_a_live_lease_alone(backend):
    # Retried at once: a burst worker started right after the rescue must find it runnable.
    app = backend.app(transaction=False, backoff=lambda attempt: 0)
    ran: list[int] = []

    @app.task("orphan")
    def orphan(job, session):
        ran.append(job.attempt)

    utc = dt.timezone.utc
    ended = _left_by_a_dead_worker(backend, app, "orphan", dt.datetime(2020, 1, 1, 1, tzinfo=utc))
    live = _left_by_a_dead_worker(backend, app, "orphan", dt.datetime(2999, 1, 1, tzinfo=utc))
    result = app.run_maintenance("rescue", strategy=backend.strategy)
    assert f"rescued 1 job(s) whose lease ended: {ended}" in result
    rescued = row_of(backend, ended)
    assert (rescued["status"], rescued["attempt"]) == ("available", 1)
    assert "stopped heartbeating" in rescued["message"]
    assert row_of(backend, live)["status"] == "running"
    backend.run_worker(app, max_jobs=1)
    assert ran == [2]
    assert row_of(backend, ended)["status"] == "succeeded"


def test_the_heartbeat_moves_a_running_jobs_lease_on(backend):
    app = backend.app(transaction=False)
    jobs = app.tables.jobs
    leases: list[Any] = []
    moved = threading.Event()

    @app.task("watched")
    def watched(job, session):
        def lease(conn: sa.Connection) -> Any:
            return conn.execute(sa.select(jobs.c.lease_until).where(jobs.c.id == job.id)).scalar()

        leases.append(elsewhere(backend, lease))
        for _ in range(int(DEADLOCK_BOUND / 0.05)):  # until a heartbeat has moved it on
            if elsewhere(backend, lease) > leases[0]:
                moved.set()
                return
            threading.Event().wait(0.05)

    app.enqueue(None, "watched", {})
    backend.run_worker(app, max_jobs=1, heartbeat_interval=0.05, lease_seconds=30)
    assert moved.is_set()


def test_tasks_of_both_modes_share_a_queue_and_a_batch(backend):
    app = backend.app()  # in the claim's transaction unless the task says otherwise
    seen: dict[int, str] = {}
    jobs = app.tables.jobs

    def status_elsewhere(job_id: int) -> str:
        return elsewhere(
            backend,
            lambda conn: conn.execute(sa.select(jobs.c.status).where(jobs.c.id == job_id)).scalar(),
        )

    @app.task("outside", transaction=False)
    def outside(job, session):
        seen[job.id] = status_elsewhere(job.id)

    @app.task("inside")
    def inside(job, session):
        session.execute(effects.insert().values(job_id=job.id, note="inside"))

    ids = [app.enqueue(None, name, {}) for name in ("inside", "outside") * 3]
    summary = backend.run_worker(app, batch_size=10)
    assert summary.succeeded == 6
    assert {row_of(backend, job_id)["status"] for job_id in ids} == {"succeeded"}
    assert sorted(seen.values()) == ["running"] * 3
    assert backend.effect_ids() == sorted(ids[0::2])


@pytest.mark.parametrize("value", ["no", 0, "false"])
def test_a_mode_that_is_not_a_boolean_is_refused_in_one_line(database, value):
    app = database.app()
    with pytest.raises(dbqueue.ConfigurationError, match="transaction=.* must be True"):
        app.task("bad", transaction=value)
    with pytest.raises(dbqueue.ConfigurationError, match="transaction=.* must be True"):
        database.app(transaction=value)


def readme_sample(name: str) -> str:
    """The README's Python block that follows ``<!-- sample: name -->``."""
    text = (Path(__file__).parents[2] / "README.md").read_text()
    return text.split(f"<!-- sample: {name} -->\n```python\n", 1)[1].split("```", 1)[0]


def test_the_readmes_long_job_sample_runs_as_written(database):
    app = database.app()
    metadata = sa.MetaData()
    rendered = sa.Table(
        f"{database.prefix}rendered",
        metadata,
        sa.Column("video", sa.Integer, primary_key=True),
        sa.Column("part", sa.Integer, primary_key=True),
    )
    engine = database.engine()
    metadata.drop_all(engine)
    metadata.create_all(engine)
    renders: list[tuple[int, int]] = []
    names = {"app": app, "rendered": rendered, "render": lambda *args: renders.append(args)}
    exec(readme_sample("long-jobs"), names)
    job_id = app.enqueue(None, "render_video", {"video": 7, "parts": [1, 2, 3]})
    database.run_worker(app)
    with engine.connect() as conn:
        parts = conn.execute(sa.select(rendered.c.video, rendered.c.part).order_by("part"))
        assert list(map(tuple, parts)) == [(7, 1), (7, 2), (7, 3)]
    metadata.drop_all(engine)
    engine.dispose()
    assert renders == [(7, 1), (7, 2), (7, 3)]
    done = row_of(database, job_id)
    assert (done["status"], done["result"]) == ("succeeded", {"parts": 3})


LEASED_APP = """
import sqlalchemy as sa
import dbqueue

app = dbqueue.App()

@app.task("seen")
def seen(job, session):
    jobs = app.tables.jobs
    with app.engine.connect() as conn:  # what another connection sees while it runs
        row = conn.execute(sa.select(jobs.c.status, jobs.c.lease_until).where(jobs.c.id == job.id))
        status, lease = row.one()
    return {"status": status, "leased": lease is not None}
"""


@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_worker_command_runs_jobs_outside_their_transaction_when_told(database, tmp_path, how):
    (tmp_path / "leased_app.py").write_text(LEASED_APP)
    app = database.app()
    job_id = app.enqueue(None, "seen", {})
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DBQUEUE_", "DB_"))},
        **database.env(),
        "PYTHONPATH": str(tmp_path),
        # The module's App reads them too (its handler looks at the row from another connection).
        "DBQUEUE_URL": database.url,
        "DBQUEUE_TABLE_PREFIX": database.prefix,
    }
    args = ["worker", "--burst"]
    if how == "flag":
        args.append("--no-transaction")
    else:
        env["DBQUEUE_TRANSACTION"] = "false"
    dbqueue_command = str(Path(sys.executable).parent / "dbqueue")
    done = subprocess.run(
        [dbqueue_command, *args, "--app", "leased_app:app"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    row = row_of(database, job_id)
    assert (row["status"], row["result"]) == ("succeeded", {"status": "running", "leased": True})


def test_a_periodic_tasks_jobs_run_outside_their_transaction_when_it_says_so(backend):
    app = backend.app()
    seen: list[str] = []
    jobs = app.tables.jobs

    @app.periodic("*/5 * * * *", name="leased_tick", catch_up="latest")
    @app.task("leased_tick_task", transaction=False)
    def tick(job, session):
        query = sa.select(jobs.c.status).where(jobs.c.id == job.id)
        seen.append(elsewhere(backend, lambda conn: conn.execute(query).scalar()))

    engine = backend.engine()
    with engine.begin() as conn:
        conn.execute(sa.delete(app.tables.periodic))
    engine.dispose()
    first = app.enqueue_periodic(dt.datetime(2026, 1, 1, 12, 0, 1, tzinfo=dt.timezone.utc))
    assert [outcome.job_id is not None for outcome in first] == [True]
    backend.run_worker(app)
    assert seen == ["running"]

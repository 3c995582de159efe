"""Middlewares around every handler (``app.middleware``) and the workers' hooks
(``@app.on_worker_start`` / ``on_worker_stop`` / ``on_worker_error``): the order they run in,
what they see, and that eager mode runs the middlewares too. Nothing here depends on the
database or strategy, so SQLite alone runs it."""

from __future__ import annotations

import logging
import time

import pytest

import dbqueue

pytestmark = pytest.mark.parametrize("backend", ["sqlite-sqlite"], indirect=True)


def test_logging_and_error_reporting_middlewares_wrap_every_handler_in_order(backend, caplog):
    app = backend.app()
    seen: list[str] = []
    reported: list[tuple[str, str]] = []
    logger = logging.getLogger("test.jobs")

    @app.middleware
    def log_jobs(subject, call_next):
        what = f"batch of {len(subject)}" if isinstance(subject, list) else f"job {subject.task}"
        logger.info("started %s", what)
        seen.append(f"log>{what}")
        try:
            return call_next()
        finally:
            seen.append(f"log<{what}")
            logger.info("finished %s", what)

    @app.middleware
    def report_errors(subject, call_next):
        seen.append("report>")
        try:
            value = call_next()
        except Exception as exc:
            reported.append((type(exc).__name__, str(exc)))
            raise
        seen.append("report<")
        return value

    @app.task("ok")
    def ok(job, session):
        seen.append("handler ok")
        return "fine"

    @app.task("boom", max_attempts=1)
    def boom(job, session):
        seen.append("handler boom")
        raise ValueError("it broke")

    @app.batch_task("sync", max_size=10, max_wait=0)
    def sync(jobs, session):
        seen.append(f"handler sync {[job.payload for job in jobs]}")

    caplog.set_level(logging.INFO, logger="test.jobs")
    good = app.enqueue(None, "ok", priority=1)
    bad = app.enqueue(None, "boom", priority=2)
    app.enqueue_many(None, [{"task": "sync", "payload": n, "priority": 3} for n in range(3)])
    backend.run_worker(app, batch_size=1)
    assert seen == [
        "log>job ok",
        "report>",
        "handler ok",
        "report<",
        "log<job ok",
        "log>job boom",
        "report>",
        "handler boom",
        "log<job boom",
        "log>batch of 3",
        "report>",
        "handler sync [0, 1, 2]",
        "report<",
        "log<batch of 3",
    ]
    assert reported == [("ValueError", "it broke")]
    assert "started job ok" in caplog.text and "finished batch of 3" in caplog.text
    assert app.get_job(good)["result"] == "fine"  # the middleware passed the value on
    failed = app.get_job(bad)
    assert failed["status"] == "dead" and "ValueError: it broke" in failed["message"]


def test_a_middleware_that_raises_fails_the_job_and_one_that_skips_the_call_succeeds_it(backend):
    app = backend.app()
    ran: list[int] = []

    @app.middleware
    def gate(job, call_next):
        if job.payload == "refuse":
            raise PermissionError("refused by the gate")
        if job.payload == "skip":
            return None  # the handler never runs; the job succeeds
        return call_next()

    @app.task("t", max_attempts=1)
    def t(job, session):
        ran.append(job.id)

    refused, skipped, runs = (app.enqueue(None, "t", p) for p in ("refuse", "skip", "run"))
    backend.run_worker(app)
    assert ran == [runs]
    assert "PermissionError: refused by the gate" in app.get_job(refused)["message"]
    assert app.get_job(skipped)["status"] == "succeeded"


def test_worker_hooks_run_once_around_the_jobs_and_errors_reach_the_error_hook(backend):
    app = backend.app()
    events: list[str] = []

    @app.on_worker_start
    def started(worker):
        events.append(f"start {worker.name}")

    @app.on_worker_stop
    def stopped(worker):
        events.append(f"stop {worker.name}")

    @app.task("t")
    def t(job, session):
        events.append("job")

    app.enqueue(None, "t")
    backend.run_worker(app, name="w1")
    assert events == ["start w1", "job", "stop w1"]

    # An error no handler caught: here the worker's tables are missing (a fatal one).
    errors: list[tuple[str, str]] = []
    missing = dbqueue.App(backend.url, table_prefix="batch_nothing_here_")
    missing.on_worker_error(lambda exc, worker: errors.append((type(exc).__name__, worker.name)))
    with pytest.raises(dbqueue.SchemaMissingError):
        missing.run_worker(burst=True, install_signal_handlers=False, name="w2")
    assert errors == [("SchemaMissingError", "w2")]


def test_a_start_hook_that_raises_keeps_the_worker_from_claiming(backend):
    app = backend.app()
    errors: list[BaseException] = []
    ran: list[int] = []

    @app.on_worker_start
    def refuse(worker):
        raise RuntimeError("no config")

    app.on_worker_error(lambda exc, worker: errors.append(exc))
    app.on_worker_stop(lambda worker: ran.append(-1))  # never started: never stopped

    @app.task("t")
    def t(job, session):
        ran.append(job.id)

    job_id = app.enqueue(None, "t")
    with pytest.raises(RuntimeError, match="no config"):
        backend.run_worker(app)
    assert ran == [] and [str(e) for e in errors] == ["no config"]
    assert app.get_job(job_id)["status"] == "available"


def test_eager_mode_runs_the_middlewares_and_batch_handlers(backend):
    app = backend.app(eager=True)
    seen: list[object] = []
    app.middleware(lambda subject, call_next: seen.append(subject) or call_next())

    @app.batch_task("sync", max_size=5)
    def sync(jobs, session):
        seen.append([job.payload for job in jobs])

    @app.task("one")
    def one(job, session):
        seen.append(job.payload)

    app.enqueue(None, "one", "a")
    app.enqueue(None, "sync", "b")
    assert isinstance(seen[0], dbqueue.Job) and seen[0].payload == "a" and seen[1] == "a"
    # Eager mode runs each job as its enqueue commits: a batch handler gets a batch of one.
    assert [job.payload for job in seen[2]] == ["b"] and seen[3] == ["b"]  # type: ignore[attr-defined]


def test_a_batch_past_its_timeout_fails_every_job_of_it(backend):
    app = backend.app()

    @app.batch_task("slow", max_size=5, max_wait=0, timeout=0.3, max_attempts=1)
    def slow(jobs, session):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # pure Python: the timeout interrupts it
            pass

    ids = [app.enqueue(None, "slow", n) for n in range(3)]
    backend.run_worker(app)
    jobs = [app.get_job(i) for i in ids]
    assert [j["status"] for j in jobs] == ["dead"] * 3
    assert all("the batch of 3 jobs" in j["message"] for j in jobs), jobs[0]["message"]
    assert all("JobTimeoutError" in j["message"] for j in jobs)


def test_bad_registrations_name_the_fix(backend):
    app = backend.app()
    with pytest.raises(dbqueue.ConfigurationError, match="max_size=0 must be a whole number"):
        app.batch_task("x", max_size=0)
    with pytest.raises(dbqueue.ConfigurationError, match="max_wait=-1 must be a number"):
        app.batch_task("x", max_wait=-1)
    with pytest.raises(dbqueue.ConfigurationError, match="takes a function"):
        app.middleware("not a function")  # type: ignore[arg-type]

"""Handlers that misbehave, on every backend: BaseException subclasses, and hangs past a timeout.

A worker must survive its handlers: whatever one raises or however long it blocks, the job gets a
failed attempt that says what happened, and the worker goes on with all of its threads.
"""

from __future__ import annotations

import threading
import time

import pytest
from support.backends import effect_rows, effects
from support.waiting import wait_for

import dbqueue


def no_delay(attempt: int) -> float:
    return 0.0


@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt, GeneratorExit])
def test_a_base_exception_from_a_handler_is_a_failed_attempt_and_the_thread_goes_on(
    backend, exc_type
):
    app = backend.app()

    @app.task("raiser", max_attempts=1)
    def raiser(job, session):
        session.execute(effects.insert().values(job_id=job.id, note="rolled back"))
        raise exc_type("raised by the handler")

    @app.task("fine")
    def fine(job, session):
        session.execute(effects.insert().values(job_id=job.id, note="fine"))

    bad = app.enqueue(None, "raiser", priority=1)
    app.enqueue_many(None, [{"task": "fine", "priority": 2} for _ in range(3)])
    # One thread: the jobs after the bad one can only run if that thread survived it.
    summary = backend.run_worker(app, concurrency=1, batch_size=1)
    assert (summary.succeeded, summary.failed) == (3, 1)
    job = app.get_job(bad)
    assert job["status"] == "dead"
    assert job["message"].startswith(f"{exc_type.__name__}: raised by the handler"), job["message"]
    fine_ids = [j["id"] for j in backend.jobs() if j["task"] == "fine"]
    assert effect_rows(backend, "job_id", "note") == [
        (i, "fine") for i in fine_ids
    ]  # the bad job's write rolled back


@pytest.mark.both_modes
def test_a_handler_running_past_its_timeout_fails_that_attempt_and_is_retried(backend):
    app = backend.app()

    @app.task("spinner", timeout=0.5, backoff=no_delay)
    def spinner(job, session):
        session.execute(effects.insert().values(job_id=job.id, note=f"attempt {job.attempt}"))
        if job.attempt == 1:
            while True:  # pure Python: the watchdog's JobTimeoutError stops it
                pass
        return "quick this time"

    job_id = app.enqueue(None, "spinner")
    # A long grace: the exception alone must stop this handler, with no thread given up.
    summary = backend.run_worker(app, concurrency=1, timeout_grace=60)
    job = app.get_job(job_id)
    assert (job["status"], job["attempt"], job["result"]) == ("succeeded", 2, "quick this time")
    assert job["previous_status"] == "failed"
    assert job["previous_message"].startswith(
        f"JobTimeoutError: job {job_id} (task 'spinner') ran past its 0.5 s timeout"
    ), job["previous_message"]
    assert "spinner" in job["previous_message"]  # the traceback shows where it was stuck
    assert summary.abandoned_threads == 0 and summary.failed == 1
    assert effect_rows(backend, "job_id", "note") == [
        (job_id, "attempt 2")
    ]  # the timed-out attempt rolled back


def test_the_worker_wide_job_timeout_applies_to_tasks_without_their_own(backend):
    app = backend.app()

    @app.task("spinner", max_attempts=1)
    def spinner(job, session):
        while True:
            pass

    @app.task("patient", max_attempts=1, timeout=60)
    def patient(job, session):
        time.sleep(0.3)  # longer than the worker's default, shorter than its own timeout

    spun = app.enqueue(None, "spinner")
    waited = app.enqueue(None, "patient")
    backend.run_worker(app, job_timeout=0.2)
    assert app.get_job(spun)["status"] == "dead"
    assert "ran past its 0.2 s timeout" in app.get_job(spun)["message"]
    assert app.get_job(waited)["status"] == "succeeded"


@pytest.mark.both_modes
def test_a_handler_blocked_in_c_is_abandoned_its_claim_released_and_its_thread_replaced(backend):
    app = backend.app()
    release = threading.Event()
    resumed = threading.Event()
    late_write: list[str] = []

    @app.task("stuck", timeout=0.5, backoff=no_delay)
    def stuck(job, session):
        if job.attempt == 1:
            session.execute(effects.insert().values(job_id=job.id, note="before blocking"))
            try:
                release.wait()  # blocked in C: JobTimeoutError cannot reach it
            except dbqueue.JobTimeoutError:  # delivered once it unblocks, long after
                late_write.append("timeout")
            try:  # a handler that carries on anyway: nothing it writes may land
                session.execute(effects.insert().values(job_id=-job.id, note="after abandon"))
                session.flush()
                late_write.append("flushed")
            except Exception as exc:
                late_write.append(type(exc).__name__)
            finally:
                resumed.set()
            return "must not count"
        session.execute(effects.insert().values(job_id=job.id, note=f"attempt {job.attempt}"))
        return "second attempt"

    @app.task("other")
    def other(job, session):
        session.execute(effects.insert().values(job_id=job.id, note="other"))

    stuck_id = app.enqueue(None, "stuck", priority=1)
    other_id = app.enqueue(None, "other", priority=2)
    worker = app.worker(
        strategy=backend.strategy,
        concurrency=1,  # only a replacement thread can run anything after the stuck job
        batch_size=1,
        poll_interval=0.05,
        timeout_grace=0.5,
        install_signal_handlers=False,
    )
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:

        def both_done() -> bool:
            return {app.get_job(i)["status"] for i in (stuck_id, other_id)} == {"succeeded"}

        wait_for(both_done, 60, "the stuck job's retry and the other job to succeed")
    finally:
        worker.stop()
        runner.join(60)
    assert not runner.is_alive()  # run() returned although the abandoned thread is blocked
    assert worker.summary.abandoned_threads == 1
    job = app.get_job(stuck_id)
    assert (job["attempt"], job["result"]) == (2, "second attempt")
    message = job["previous_message"]
    assert message.startswith(f"JobTimeoutError: job {stuck_id} (task 'stuck') ran past its 0.5 s")
    assert "thread was abandoned" in message and "connection ended" in message, message

    release.set()
    assert resumed.wait(30)
    assert late_write[0] == "timeout" and late_write[1] != "flushed", late_write
    time.sleep(0.5)  # give the unblocked thread time to try anything else it would
    assert effect_rows(backend, "job_id", "note") == [(stuck_id, "attempt 2"), (other_id, "other")]
    assert app.get_job(stuck_id)["result"] == "second attempt"


@pytest.mark.parametrize("timeout", [0, -1, "10", True])
def test_a_bad_timeout_is_refused_at_registration(backend, timeout):
    app = backend.app()
    with pytest.raises(dbqueue.ConfigurationError, match="positive number of seconds"):
        app.task("t", timeout=timeout)(lambda job, session: None)
    with pytest.raises(dbqueue.ConfigurationError, match="job_timeout"):
        app.worker(job_timeout=timeout if timeout != "10" else -5)


def test_a_handler_that_returns_a_coroutine_fails_its_attempt_instead_of_succeeding(backend):
    """A plain def that hands back an un-awaited coroutine (a wrapped async function) must not
    mark the job done: the handler's work never ran."""
    app = backend.app()

    async def never_awaited(job, session):
        session.execute(effects.insert().values(job_id=job.id, note="ran"))

    @app.task("wrapped_async", max_attempts=1)
    def wrapped_async(job, session):
        return never_awaited(job, session)

    job_id = app.enqueue(None, "wrapped_async")
    summary = backend.run_worker(app)
    assert (summary.succeeded, summary.failed) == (0, 1)
    job = app.get_job(job_id)
    assert job["status"] == "dead"
    assert "which a worker thread cannot await" in job["message"], job["message"]
    assert effect_rows(backend) == []

"""Retries, delayed jobs and requeued jobs start when due while other threads are busy.

Each worker here polls once an hour (``support/busy_worker.py``), and two of its four threads
are held by long jobs until the end of the test: a job that runs within the test's (generous)
deadline was started because the worker learnt when it falls due — the retry its own thread
scheduled, the delayed job its own handler enqueued, the requeue that woke it — not by a poll.
Where the database has one writer at a time (SQLite), a running job holds it, so nothing else
could run beside a long job: there the threads are all idle, and the rest holds.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from support.backends import backend_keys, effect_rows
from support.idle_worker import IdleWorker
from support.waiting import wait_for

pytestmark = pytest.mark.slow

WORKER = Path(__file__).resolve().parents[1] / "support" / "busy_worker.py"
#: Long enough for any loaded machine; an hour-long poll would be far longer.
DEADLINE = 60


class BusyWorker:
    """``with BusyWorker(backend, tmp_path) as busy:`` a worker process with two long jobs
    running (enqueued by ``long_jobs`` before it starts, with whatever else the test enqueued);
    leaving releases them and stops the worker, which must exit cleanly."""

    def __init__(self, backend, tmp_path: Path, *args: str, long_jobs: int = 2) -> None:
        self.backend, self.tmp = backend, tmp_path
        self.app = backend.app()
        self.log = tmp_path / "worker.log"
        self.release = tmp_path / "release"
        #: Touched on leaving, whatever happened: no long job outlives the test.
        self.releases = [self.release]
        self.long_ids = [
            self.app.enqueue(
                None, "long", {"started": str(tmp_path / f"long{n}"), "release": str(self.release)}
            )
            for n in range(0 if backend.single_writer else long_jobs)
        ]
        self.args = args
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> BusyWorker:
        command = [sys.executable, str(WORKER), self.backend.url, self.backend.strategy]
        command += [*self.backend.worker_args(), *self.args]
        self.process = subprocess.Popen(
            command, stdout=self.log.open("ab"), stderr=subprocess.STDOUT
        )
        for n in range(len(self.long_ids)):
            self.wait_for_file(self.tmp / f"long{n}", f"long job {n} to start")
        return self

    def wait_for_file(self, path: Path, what: str) -> None:
        wait_for(path.exists, DEADLINE, what, log=self.log)

    def wait_for_row(self, job_id: int, what: str) -> None:
        wait_for(lambda: job_id in self.rows(), DEADLINE, what, log=self.log, state=self.rows)

    def rows(self) -> dict[int, str]:
        return {job_id: note for job_id, note, _ in effect_rows(self.backend)}

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        for release in self.releases:
            release.touch()
        try:
            for job_id in self.long_ids:
                self.wait_for_row(job_id, "the long jobs to finish once released")
        finally:
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(timeout=DEADLINE)
            finally:
                if self.process.poll() is None:
                    self.process.kill()
            self.app.engine.dispose()
        assert code == 0, self.log.read_text()[-3000:]
        assert "Traceback" not in self.log.read_text()


def the_long_jobs_still_run(busy: BusyWorker) -> None:
    """Their rows are written once released, which the test has not done yet."""
    assert not set(busy.long_ids) & set(busy.rows())


@pytest.mark.parametrize(
    ("kind", "slots"), [("retry", "threads"), ("backoff", "threads"), ("retry", "loop")]
)
def test_a_retry_starts_when_due_while_other_threads_are_busy(backend, tmp_path, kind, slots):
    """The failed attempt's retry falls due a second later: its thread, finding nothing yet,
    leaves the polling to the idle one, which sleeps until then instead of for the hour."""
    extra = ("--async-slots",) if slots == "loop" else ()
    go = tmp_path / "go"
    flaky_payload = {"started": str(tmp_path / "flaky"), "go": str(go), "kind": kind}
    app = backend.app()
    flaky = app.enqueue(None, "flaky", flaky_payload)
    with BusyWorker(backend, tmp_path, *extra) as busy:
        busy.wait_for_file(tmp_path / "flaky", "the flaky job's first attempt")
        go.touch()  # it fails now; the other threads wait or are busy
        busy.wait_for_row(flaky, "the retry to run")
        the_long_jobs_still_run(busy)
    job = app.get_job(flaky)
    assert job is not None and (job["status"], job["attempt"]) == ("succeeded", 2)
    assert busy.rows()[flaky] == "attempt 2"
    app.engine.dispose()


@pytest.mark.parametrize(
    "backend",
    backend_keys(lambda spec: spec.inserts_wake_workers and not spec.single_writer),
    indirect=True,
)
def test_the_polling_thread_hands_its_role_over_when_it_takes_a_long_job(backend, tmp_path):
    """Two threads. The one that idles first polls for both, and is then pushed a long job;
    the other, idle once its own long job ends, must poll in its stead — else the retry it
    schedules next waits for its hour-long safety net."""
    app = backend.app()

    releases = {name: tmp_path / f"release-{name}" for name in ("first", "second", "third")}

    def long_job(name: str) -> int:
        payload = {"started": str(tmp_path / name), "release": str(releases[name])}
        return app.enqueue(None, "long", payload)

    first, second = long_job("first"), long_job("second")
    with BusyWorker(backend, tmp_path, "--concurrency", "2", long_jobs=0) as busy:
        busy.releases += releases.values()
        for name in ("first", "second"):
            busy.wait_for_file(tmp_path / name, f"the {name} long job to start")
        releases["first"].touch()
        busy.wait_for_row(first, "the first long job to end")  # its thread now polls
        third = long_job("third")  # pushed to the polling thread, which takes it
        busy.wait_for_file(tmp_path / "third", "the third long job to start")
        releases["second"].touch()
        busy.wait_for_row(second, "the second long job to end")
        go = tmp_path / "go"
        go.touch()
        flaky_payload = {"started": str(tmp_path / "flaky"), "go": str(go), "kind": "retry"}
        flaky = app.enqueue(None, "flaky", flaky_payload)  # pushed to the idle thread
        busy.wait_for_row(flaky, "the retry to run")
        assert third not in busy.rows()  # still running
        releases["third"].touch()
        busy.wait_for_row(third, "the third long job to end")
    app.engine.dispose()


def test_a_job_delayed_by_this_process_starts_when_due_while_other_threads_are_busy(
    backend, tmp_path
):
    """A handler enqueues a job for later: the enqueue's wake-up finds nothing runnable, so
    the idle poller reads the next due time and sleeps until then."""
    app = backend.app()
    app.enqueue(None, "delayer", {"delay": 1.0})
    with BusyWorker(backend, tmp_path) as busy:
        wait_for(
            lambda: later_job(app) is not None, DEADLINE, "the delayed job's enqueue", busy.log
        )
        delayed = later_job(app)
        assert delayed is not None
        busy.wait_for_row(delayed, "the delayed job to run")
        the_long_jobs_still_run(busy)
    app.engine.dispose()


def later_job(app) -> int | None:
    with app.engine.connect() as conn:
        jobs = app.names.jobs
        found = conn.execute(sa.text(f"SELECT id FROM {jobs} WHERE task = 'later'")).scalar()
        return None if found is None else int(found)


@pytest.mark.parametrize(
    "backend",
    backend_keys(lambda spec: spec.inserts_wake_workers or spec.claims_through_lock_server),
    indirect=True,
)
def test_a_job_requeued_elsewhere_starts_at_once_where_wake_ups_are_pushed(backend, tmp_path):
    """Requeued from another process (the CLI's ``dbqueue dead requeue``, the dashboard): the
    requeue wakes workers as an insert does — a NOTIFY, the lock server's hint, a commit
    SQLite's watch sees. Where nothing pushes, workers find it at their next poll."""
    app = backend.app()
    doomed = app.enqueue(None, "dies_once", {}, max_attempts=1)
    with BusyWorker(backend, tmp_path) as busy:
        wait_for(lambda: is_dead(app, doomed), DEADLINE, "the job to die", busy.log)
        assert app.requeue_dead([doomed]) == [doomed]
        busy.wait_for_row(doomed, "the requeued job to run")
        the_long_jobs_still_run(busy)
    app.engine.dispose()


def is_dead(app, job_id: int) -> bool:
    job = app.get_job(job_id)
    return job is not None and job["status"] == "dead"


@pytest.mark.parametrize("target", ["engine", "session"])
def test_a_job_requeued_by_this_process_wakes_its_workers(backend, target):
    """In the workers' own process the requeue wakes them on commit, on every database."""
    app = backend.app()
    runs: list[int] = []

    @app.task("dies_once", max_attempts=1)
    def dies_once(job, session):
        runs.append(job.id)
        if job.previous_status != "dead":
            raise RuntimeError("dead on the first run")

    with IdleWorker(app, backend.strategy) as running:
        doomed = app.enqueue(None, "dies_once", {}, max_attempts=1)
        wait_for(lambda: is_dead(app, doomed), DEADLINE, "the job to die")
        if target == "engine":
            assert app.requeue_dead([doomed]) == [doomed]
        else:
            with Session(app.engine) as session, session.begin():
                assert app.requeue_dead([doomed], session) == [doomed]
        wait_for(lambda: len(runs) == 2, DEADLINE, "the requeued job to run")
        assert running.worker.summary.failed == 1
    assert app.get_job(doomed)["status"] == "succeeded"
    assert runs == [doomed, doomed]

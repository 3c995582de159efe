"""Stopping a worker process: the first SIGTERM/SIGINT waits for the running job, a second one
(or the shutdown timeout) stops at once, and the process exits as soon as it says it stopped.

The handlers wait for a file the test writes (``wait_file``), so a job ends only when the test
says so: whether the worker waited for it, or stopped without it, never depends on timing.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import test_processes as processes
from support.backends import effect_rows, effects
from support.waiting import wait_for

pytestmark = pytest.mark.slow

DBQUEUE = str(Path(sys.executable).parent / "dbqueue")
#: The worker's last line (dbqueue.worker's), before the test process prints its summary.
STOPPED = re.compile(r"INFO dbqueue\.worker: worker \S+ stopped: ")


def start(backend, log: Path, *args: str) -> subprocess.Popen:
    worker = processes.start_worker(backend, "--no-maintenance", *args, log=log)
    wait_for(lambda: "concurrency" in log.read_text(), 60, "the worker to start", log)
    return worker


def exits_after_saying_so(worker: subprocess.Popen, log: Path) -> int:
    """Wait for the worker's "stopped" line, then for its exit: nothing may hold the process
    up after that line (the bound only turns a hang into a failure)."""
    wait_for(lambda: STOPPED.search(log.read_text()), 60, "the worker's stopped line", log)
    try:
        return worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"alive after its stopped line:\n{log.read_text()[-3000:]}") from None


def signalled(worker: subprocess.Popen, log: Path, text: str) -> None:
    worker.send_signal(signal.SIGTERM)
    wait_for(lambda: text in log.read_text(), 30, repr(text), log)


def test_one_signal_waits_for_the_running_job_then_exits(database, tmp_path):
    app = database.app()
    started, release = tmp_path / "started", tmp_path / "release"
    job_id = app.enqueue(None, "effect", {"started_file": str(started), "wait_file": str(release)})
    log = tmp_path / "worker.log"
    worker = start(database, log)
    try:
        wait_for(started.exists, 30, "the handler to start", log)
        signalled(worker, log, "SIGTERM received: no new jobs will be claimed")
        # The job cannot end before the test releases it: the worker must be waiting for it.
        assert worker.poll() is None and app.get_job(job_id)["status"] != "succeeded"
        release.touch()
        assert exits_after_saying_so(worker, log) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
    assert app.get_job(job_id)["status"] == "succeeded"
    assert [row[0] for row in effect_rows(database)] == [job_id]


def test_a_second_signal_stops_at_once_and_another_worker_runs_the_job_once(backend, tmp_path):
    """In-transaction claims roll back with the process's connection: the job is available at
    once. A committed claim stays 'running' until rescue finds its lock free, as for a worker
    that died. Either way the abandoned attempt's write is gone and the job runs once more."""
    app = backend.app()
    started, release = tmp_path / "started", tmp_path / "release"
    job_id = app.enqueue(None, "effect", {"started_file": str(started), "wait_file": str(release)})
    log = tmp_path / "worker.log"
    worker = start(backend, log)
    try:
        wait_for(started.exists, 30, "the handler to start", log)  # its row is written, uncommitted
        signalled(worker, log, "SIGTERM received: no new jobs will be claimed")
        signalled(worker, log, "SIGTERM received again: stopping at once")
        assert exits_after_saying_so(worker, log) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
    assert f"abandoning job(s) {job_id}:" in log.read_text()
    assert effect_rows(backend) == []  # the abandoned attempt's write rolled back
    job = app.get_job(job_id)
    if backend.commits_claims:
        assert job["status"] == "running"
        result = app.run_maintenance("rescue", strategy=backend.strategy)
        assert result.startswith("rescued 1 job(s)"), result
    else:
        assert (job["status"], job["attempt"]) == ("available", 0)
    release.touch()
    rescuer = start(backend, tmp_path / "rescuer.log")
    try:
        done = lambda: app.get_job(job_id)["status"] == "succeeded"  # noqa: E731
        wait_for(done, 60, "the job to run again", tmp_path / "rescuer.log")
    finally:
        rescuer.send_signal(signal.SIGTERM)
        assert rescuer.wait(timeout=60) == 0, (tmp_path / "rescuer.log").read_text()[-3000:]
    attempt = app.get_job(job_id)["attempt"]
    assert attempt == (2 if backend.commits_claims else 1)
    assert effect_rows(backend) == [(job_id, f"attempt {attempt}", rescuer.pid)]


def test_the_shutdown_timeout_stops_a_worker_whose_job_never_ends(async_database, tmp_path):
    """The handler is a plain one on an async worker's slot thread: abandoned, blocked, it must
    not keep the process alive either."""
    database = async_database
    app = database.app()
    started = tmp_path / "started"
    never = tmp_path / "never"  # the handler waits for a file nobody writes
    job_id = app.enqueue(None, "effect", {"started_file": str(started), "wait_file": str(never)})
    log = tmp_path / "worker.log"
    worker = start(database, log, "--async-slots", "--shutdown-timeout", "0.5")
    try:
        wait_for(started.exists, 30, "the handler to start", log)
        signalled(worker, log, "for at most 0.5s (the shutdown timeout)")
        assert exits_after_saying_so(worker, log) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
    assert f"(its 0.5s shutdown timeout ran out): abandoning job(s) {job_id}:" in log.read_text()
    assert effect_rows(database) == []


def test_stop_now_from_another_thread_abandons_the_running_handler(database):
    """``worker.stop(now=True)``, in-process: run() returns while the handler runs (it is
    interrupted: Abandoned stops its Python code), and none of its writes is kept."""
    app = database.app()
    started, release = threading.Event(), threading.Event()

    @app.task("waits")
    def waits(job, session):
        session.execute(effects.insert().values(job_id=job.id, note="abandoned"))
        session.flush()
        started.set()
        while not release.wait(0.01):  # Python code between waits: Abandoned reaches it
            pass

    job_id = app.enqueue(None, "waits")
    worker = app.worker(install_signal_handlers=False, poll_interval=0.02, maintenance=False)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        assert started.wait(60), "the handler never started"
        worker.stop(now=True)
        runner.join(60)
        assert not runner.is_alive(), "run() did not return"
    finally:
        release.set()
    assert worker.summary.abandoned_threads == 1 and worker.summary.processed == 0
    assert effect_rows(database) == []
    expected = "running" if database.commits_claims else "available"
    assert app.get_job(job_id)["status"] == expected


BLOCKED_APP = """
import time
from pathlib import Path

import dbqueue

app = dbqueue.App()


@app.task("blocked")
def blocked(job, session):
    Path(job.payload["started_file"]).write_text("")
    time.sleep(600)  # in C: the exception a stop at once raises in the thread waits for it


@app.task("idle")  # an async task: the worker runs its jobs on slots of an event loop
async def idle(job, session):
    return None
"""


def test_the_command_exits_after_its_stopped_line_with_a_handler_blocked_in_c(postgresql, tmp_path):
    """``dbqueue worker --shutdown-timeout``: the handler (plain, on an async worker's slot)
    never returns; the command says it stopped, and its process ends then."""
    (tmp_path / "blocked_app.py").write_text(BLOCKED_APP)
    app = postgresql.app()
    started = tmp_path / "started"
    job_id = app.enqueue(None, "blocked", {"started_file": str(started)})
    log = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DBQUEUE_", "DB_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    command = [DBQUEUE, "worker", "--url", postgresql.url, "--table-prefix", postgresql.prefix]
    options = ["--app", "blocked_app:app", "--no-maintenance", "--shutdown-timeout", "0.5"]
    worker = subprocess.Popen(
        [*command, *options], cwd=tmp_path, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
    )
    try:
        wait_for(started.exists, 60, "the handler to start", log)
        signalled(worker, log, "for at most 0.5s (the shutdown timeout)")
        assert exits_after_saying_so(worker, log) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
    text = log.read_text()
    assert "1 handler(s) still blocked" in text and "Fatal Python error" not in text, text
    assert text.rstrip().endswith("worker stopped: 0 succeeded, 0 failed"), text
    assert app.get_job(job_id)["status"] == "available"  # its claim rolled back

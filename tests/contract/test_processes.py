"""Real worker processes: exactly-once under concurrency, SIGKILL mid-job, graceful SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.backends import effect_rows
from support.handlers import KINDS
from support.waiting import wait_for

pytestmark = pytest.mark.slow

WORKER = Path(__file__).resolve().parents[1] / "support" / "worker_process.py"


def start_worker(backend, *args: str, log: Path, kind: str = "sync") -> subprocess.Popen:
    """A worker process; ``kind="async"``: its handler is an async def (an async worker)."""
    extra = ["--async-handlers"] if kind == "async" else []
    return subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            backend.url,
            backend.strategy,
            *backend.worker_args(),
            *extra,
            *args,
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


#: Processes and jobs of the exactly-once test per kind of handler: the async run is smaller
#: (the suite's time budget); its claims, fences and commits are the same code. A thousand jobs
#: are a hundred batches raced for by eight claimers (the chaos suite drains 2,000 per pair).
DRAIN = {"sync": (4, 1000), "async": (2, 300)}


@KINDS
def test_four_processes_drain_1000_jobs_exactly_once(backend, tmp_path, kind):
    log = tmp_path / "workers.log"
    processes, total = DRAIN[kind]
    workers = [
        start_worker(backend, "--concurrency", "2", log=log, kind=kind) for _ in range(processes)
    ]
    try:
        wait_for(
            lambda: log.read_text().count("concurrency 2") == processes, 60, "workers to start"
        )
        app = backend.app()
        app.enqueue_many(None, [{"task": "effect", "payload": {"n": i}} for i in range(total)])

        def drained() -> bool:
            return sum(s.counts.get("succeeded", 0) for s in app.stats()) == total

        wait_for(drained, 240, f"the workers to drain {total} jobs")
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        codes = [worker.wait(timeout=60) for worker in workers]
    assert codes == [0] * processes, log.read_text()[-3000:]
    jobs = backend.jobs()
    assert len(jobs) == total
    assert {j["status"] for j in jobs} == {"succeeded"}, log.read_text()[-3000:]
    assert {j["attempt"] for j in jobs} == {1}  # no job needed a second attempt
    rows = effect_rows(backend)
    assert [r[0] for r in rows] == sorted(j["id"] for j in jobs)  # one row per job, none twice
    if not backend.single_writer:
        # Row-level claims let processes work side by side. SQLite has one write lock, and the
        # process holding it may keep winning it back while the others sleep in busy_timeout.
        assert len({r[2] for r in rows}) >= 2, "work was not shared between processes"
    assert "Traceback" not in log.read_text()


@KINDS
def test_sigkill_mid_job_loses_nothing_and_keeps_no_partial_writes(backend, tmp_path, kind):
    app = backend.app()
    started = tmp_path / "started"
    job_id = app.enqueue(None, "effect", {"sleep": 60, "started_file": str(started)})
    log = tmp_path / "worker.log"
    victim = start_worker(backend, "--no-maintenance", log=log, kind=kind)
    try:
        wait_for(started.exists, 30, "the handler to start")
        # The handler has written its effect row (flushed, uncommitted) and is sleeping.
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(timeout=10) == -signal.SIGKILL
    finally:
        if victim.poll() is None:
            victim.kill()
    assert effect_rows(backend) == []  # the killed attempt's write never appears

    if backend.commits_claims:
        # The claim was committed: the job shows as running until rescue finds its lock free.
        assert app.get_job(job_id)["status"] == "running"
        result = app.run_maintenance("rescue", strategy=backend.strategy)
        assert result.startswith("rescued 1 job(s)"), result
        job = app.get_job(job_id)
        assert (job["status"], job["attempt"]) == ("available", 1)
        assert "died" in job["message"] and job["previous_status"] == "failed"
        time.sleep(0.2)  # the retry's backoff (0.05 s × attempt)
    rescuer = start_worker(backend, "--burst", "--no-sleep", "--no-maintenance", log=log, kind=kind)
    assert rescuer.wait(timeout=60) == 0, log.read_text()[-3000:]
    job = app.get_job(job_id)
    assert job["status"] == "succeeded"
    assert job["attempt"] == (2 if backend.commits_claims else 1)
    rows = effect_rows(backend)
    assert rows == [(job_id, f"attempt {job['attempt']}", rescuer.pid)]
    assert int(started.read_text()) == victim.pid


def test_rescue_leaves_jobs_of_live_workers_alone(backend, tmp_path):
    app = backend.app()
    started = tmp_path / "started"
    job_id = app.enqueue(None, "effect", {"sleep": 2, "started_file": str(started)})
    log = tmp_path / "worker.log"
    worker = start_worker(backend, "--no-maintenance", log=log)
    try:
        wait_for(started.exists, 30, "the handler to start")
        result = app.run_maintenance("rescue", strategy=backend.strategy)
        if backend.commits_claims:
            assert result == "1 running job(s), all held by live workers", result
        else:
            # In-transaction claims commit no 'running'. On SQLite the job's transaction holds
            # the database's one write lock: the rescue tick waits for it, then finds it done.
            assert result == "no running jobs", result
        wait_for(lambda: app.get_job(job_id)["status"] == "succeeded", 30, "the job to finish")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, log.read_text()[-3000:]
    job = app.get_job(job_id)
    assert job["attempt"] == 1
    assert [r[0] for r in effect_rows(backend)] == [job_id]


def test_sigterm_finishes_the_running_job_then_exits_zero(backend, tmp_path, kind="sync"):
    """(With an async handler: ``test_async_handlers.py``, once per database.)"""
    app = backend.app()
    started = tmp_path / "started"
    first = app.enqueue(None, "effect", {"sleep": 1.5, "started_file": str(started)}, priority=1)
    second = app.enqueue(None, "effect", {}, priority=2)
    log = tmp_path / "worker.log"
    worker = start_worker(backend, "--batch-size", "1", log=log, kind=kind)
    try:
        wait_for(started.exists, 30, "the handler to start")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    assert app.get_job(first)["status"] == "succeeded"
    assert app.get_job(second)["status"] == "available"  # nothing claimed after SIGTERM
    assert [r[0] for r in effect_rows(backend)] == [first]
    text = log.read_text()
    assert "SIGTERM received" in text and "SUMMARY succeeded=1 failed=0" in text


def test_sigint_is_graceful_too(backend, tmp_path):
    app = backend.app()
    started = tmp_path / "started"
    job_id = app.enqueue(None, "effect", {"sleep": 0.5, "started_file": str(started)})
    log = tmp_path / "worker.log"
    worker = start_worker(backend, log=log)
    try:
        wait_for(started.exists, 30, "the handler to start")  # signal handlers are installed
        worker.send_signal(signal.SIGINT)
        assert worker.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    assert "SIGINT received" in log.read_text()
    assert app.get_job(job_id)["status"] == "succeeded"

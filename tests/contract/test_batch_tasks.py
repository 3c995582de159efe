"""Batch handlers (``@app.batch_task``) on every (database, strategy) pair: one call gets the
gathered jobs, a returned mapping fails only the jobs it names while the others succeed with
the handler's writes, a raised exception fails the whole batch (each job by its own rules), and
with real worker processes a SIGKILLed worker's batch runs again exactly once while a SIGTERMed
one finishes its batch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import batch_app
from support.backends import effect_rows, effects
from support.waiting import wait_for

import dbqueue

#: Run in the claim's transaction and outside it, under a lease (tests/conftest.py).
BOTH_MODES = True

TESTS = Path(__file__).resolve().parents[1]


def test_a_mapping_fails_only_the_jobs_it_names_and_the_others_commit_with_the_writes(backend):
    app = backend.app()
    calls: list[list[int]] = []

    @app.batch_task("sync", max_size=10, max_wait=0.2)
    def sync(jobs, session):
        calls.append([job.payload for job in jobs])
        failed = {}
        for job in jobs:
            if job.payload % 2 and job.attempt == 1:
                failed[job.id] = dbqueue.Retry(in_seconds=0.01, reason=f"odd {job.payload}")
            else:
                session.execute(effects.insert().values(job_id=job.id, note=f"a{job.attempt}"))
        return failed

    ids = [app.enqueue(None, "sync", n) for n in range(6)]  # (enqueue_many: ids not everywhere)
    backend.drain(app)
    assert sorted(calls[0]) == list(range(6)), calls  # gathered: one call for the six
    assert sorted(n for call in calls[1:] for n in call) == [1, 3, 5]
    jobs = {job["id"]: job for job in backend.jobs()}
    assert [jobs[i]["status"] for i in ids] == ["succeeded"] * 6
    assert [jobs[i]["attempt"] for i in ids] == [1, 2, 1, 2, 1, 2]
    assert jobs[ids[1]]["previous_message"].startswith("Retry(in_seconds=0.01): odd 1")
    # Exactly the handler's writes for the jobs that succeeded, each once.
    assert effect_rows(backend, "job_id", "note") == [
        (job_id, "a1" if n % 2 == 0 else "a2") for n, job_id in enumerate(ids)
    ]


def test_a_raised_exception_fails_the_whole_batch_and_undoes_its_writes(backend):
    app = backend.app()
    sizes: list[int] = []

    @app.batch_task("sync", max_size=10, max_wait=0.2)
    def sync(jobs, session):
        sizes.append(len(jobs))
        for job in jobs:
            session.execute(effects.insert().values(job_id=job.id, note=f"a{job.attempt}"))
        session.flush()
        if any(job.attempt == 1 for job in jobs):
            raise RuntimeError("the remote system is down")

    once = app.enqueue(None, "sync", {"n": 0}, max_attempts=1)
    others = [app.enqueue(None, "sync", {"n": n}) for n in (1, 2)]
    backend.drain(app)
    assert sizes == [3, 2]
    jobs = {job["id"]: job for job in backend.jobs()}
    dead = jobs[once]
    assert dead["status"] == "dead" and dead["attempt"] == 1  # its own max_attempts
    assert "RuntimeError: the remote system is down" in dead["message"]
    assert [jobs[i]["status"] for i in others] == ["succeeded", "succeeded"]
    assert [jobs[i]["attempt"] for i in others] == [2, 2]
    assert effect_rows(backend, "job_id", "note") == [(i, "a2") for i in others]


def test_a_bad_mapping_fails_the_batch_naming_the_fix(database):
    app = database.app()

    @app.batch_task("sync", max_size=5, max_wait=0, max_attempts=1)
    def sync(jobs, session):
        return {"not an id": ValueError("x")}

    job_id = app.enqueue(None, "sync", {})
    database.run_worker(app)
    job = app.get_job(job_id)
    assert job["status"] == "dead"
    assert (
        "its keys must be ids (or Jobs) of its batch and its values exceptions" in (job["message"])
    )


def start_worker(backend, log: Path, *args: str) -> subprocess.Popen:
    command = [str(Path(sys.executable).parent / "dbqueue"), "worker", "--url", backend.url]
    command += ["--table-prefix", backend.prefix, "--strategy", backend.strategy]
    command += ["--server", backend.server] if backend.server else []
    command += ["--app", "support.batch_app:app", "--queue", "batches", "--no-maintenance"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("DBQUEUE_URL", None)
    return subprocess.Popen(
        [*command, "--poll-interval", "0.1", *args],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
    )


@pytest.mark.slow
def test_a_killed_workers_batch_runs_again_once_and_a_stopped_one_finishes(backend, tmp_path):
    log = tmp_path / "workers.log"
    app = backend.app()
    held = {"dir": str(tmp_path)}
    ids = [app.enqueue(None, "sync", held, queue="batches") for _ in range(25)]
    first, second = start_worker(backend, log), start_worker(backend, log)
    workers = {first.pid: first, second.pid: second}
    try:

        def started() -> list[int]:
            return [int(p.name.split("-")[1]) for p in tmp_path.glob("started-*")]

        wait_for(started, 60, "a batch to start", log)
        killed = workers.pop(started()[0])
        killed.send_signal(signal.SIGKILL)
        assert killed.wait(timeout=10) == -signal.SIGKILL
        (survivor,) = workers.values()
        wait_for(lambda: survivor.pid in started(), 60, "the other worker's batch", log)
        survivor.send_signal(signal.SIGTERM)  # mid-batch: it finishes the batch, then exits
        (tmp_path / "release").touch()
        assert survivor.wait(timeout=60) == 0, log.read_text()[-3000:]
        if backend.commits_claims:  # the killed claim is committed: rescue frees it

            def rescued() -> bool:
                app.run_maintenance("rescue", strategy=backend.strategy)
                return all(job["status"] != "running" for job in backend.jobs())

            wait_for(rescued, 30, "rescue of the killed worker's jobs", log, 0.2)
        # The rest (the killed batch's jobs, those never claimed) with the same handler here.
        rest = backend.app()
        rest.batch_task("sync", queue="batches", max_size=10, max_wait=0.3)(batch_app.sync)
        backend.drain(rest, queues=["batches"])
    finally:
        for process in workers.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
    assert "Traceback" not in log.read_text()

    jobs = {job["id"]: job for job in backend.jobs()}
    assert [jobs[i]["status"] for i in ids] == ["succeeded"] * len(ids)
    rows = effect_rows(backend, "job_id", "pid")
    assert [job_id for job_id, _ in rows] == sorted(ids)  # each job's writes committed once
    pids = {pid for _, pid in rows}
    assert killed.pid not in pids  # the killed batch's writes rolled back with it
    assert survivor.pid in pids  # the stopped worker committed the batch it had started
    killed_ids = [int(i) for i in (tmp_path / f"started-{killed.pid}").read_text().split(",")]
    retried = {jobs[i]["attempt"] for i in killed_ids}
    assert retried == ({2} if backend.commits_claims else {1})

"""Faults with the lock server, on every database, with real processes and SIGKILL.

Each test runs its own `dbqueue server` (it kills it) on the backend's tables, worker processes
from tests/support/worker_process.py — whose handler inserts a row keyed by the job id in the
job's own transaction — and counts every job at the end: none lost (a row per job), none run
twice (the key would collide, and the rows are counted). Waits are on events (a file, a log line,
a row, the server's stats) with generous deadlines, never on sleeps.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.backends import BACKENDS, backend_keys, effect_rows
from support.lockserver import RawClient, ServerProcess, start_server
from support.waiting import wait_for

from dbqueue.strategies.locks import job_lock_name

WORKER = Path(__file__).resolve().parents[1] / "support" / "worker_process.py"
LOCK_SERVER_BACKENDS = backend_keys(lambda spec: spec.claims_through_lock_server)
#: Where a claim takes a lock per job on the server and commits ``running``: not SQLite, whose
#: batch transaction holds the database's one write lock from the claim to the outcome, which
#: is the claim (a killed worker's claim rolls back with it: ``test_processes.py``).
JOB_LOCK_BACKENDS = [b for b in LOCK_SERVER_BACKENDS if BACKENDS[b].commits_claims]

pytestmark = pytest.mark.slow


def start_worker(
    backend, server: ServerProcess, log: Path, *args: str, token: str | None = None, **env: str
) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DBQUEUE_LOCK_SERVER")}
    environ.update(env)
    if token or server.token:
        environ["DBQUEUE_LOCK_SERVER_TOKEN"] = token or server.token or ""
    return subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            backend.url,
            "lock_server",
            "--prefix",
            backend.prefix,
            "--server",
            server.address,
            *args,
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=environ,
    )


def lock_name(app, job_id: int) -> str:
    return job_lock_name(app.names.qualified_jobs, job_id)


def try_lock(server: ServerProcess, name: str) -> bool:
    """Whether a fresh client can take (and then gives back) the lock ``name``."""
    with RawClient(server.host, server.port) as client:
        assert client.hello(token=server.token)["ok"]
        taken = client.request({"op": "acquire", "id": 1, "names": [name], "owner": "test"})
        return taken["taken"] == [True]


def stop(process: subprocess.Popen, log: Path) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(
            f"worker did not stop on SIGTERM:\n{log.read_text()[-4000:]}"
        ) from None
    assert code == 0, log.read_text()[-4000:]


@pytest.fixture
def own_server(backend, tmp_path):
    """A lock server of this test's own (it may be killed), the backend pointed at it."""
    servers: list[ServerProcess] = []

    def start(port: int = 0, token: str | None = None) -> ServerProcess:
        server = start_server(
            backend.url, backend.prefix, tmp_path / "server.log", port=port, token=token
        )
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.mark.parametrize("backend", JOB_LOCK_BACKENDS, indirect=True)
def test_a_worker_killed_holding_a_lock_frees_it_at_once_and_the_job_is_retried(
    backend, own_server, tmp_path
):
    server = own_server()
    backend = dataclasses.replace(backend, server=server.address)
    app = backend.app()
    started = tmp_path / "started"
    job_id = app.enqueue(None, "effect", {"sleep": 120, "started_file": str(started)})
    log = tmp_path / "workers.log"
    victim = start_worker(backend, server, log, "--no-maintenance")
    wait_for(started.exists, 60, "the handler to start", log)
    assert not try_lock(server, lock_name(app, job_id)), "the running job's lock is not held"
    # A rescuer runs the rescue routine every half second ("tick" = 0.5 s, every minute).
    rescuer = start_worker(
        backend,
        server,
        log,
        "--no-sleep",
        DBQUEUE_MAINTENANCE_TICK="0.5",
        QUEUE_MINUTE_RETRY_THREAD="*/1",
    )
    try:
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(timeout=30) == -signal.SIGKILL
        # The kernel closes the dead worker's socket; the server frees its lock at once.
        wait_for(lambda: try_lock(server, lock_name(app, job_id)), 10, "the lock to free", log)
        # The rescue routine sees the free lock, retries the job, and the rescuer runs it.
        wait_for(lambda: app.get_job(job_id)["status"] == "succeeded", 120, "the retry", log)
    finally:
        stop(rescuer, log)
        if victim.poll() is None:
            victim.kill()
    job = app.get_job(job_id)
    assert job["attempt"] == 2 and job["previous_status"] == "failed"
    assert "died" in job["previous_message"]
    assert effect_rows(backend) == [(job_id, "attempt 2", rescuer.pid)]
    assert int(started.read_text()) == victim.pid  # the first attempt's write never appeared


@pytest.mark.parametrize("backend", LOCK_SERVER_BACKENDS, indirect=True)
def test_the_server_killed_and_restarted_mid_run_loses_nothing_and_runs_nothing_twice(
    backend, own_server, tmp_path
):
    server = own_server()
    backend = dataclasses.replace(backend, server=server.address)
    app = backend.app()
    total = 300
    log = tmp_path / "workers.log"
    ticks = {"DBQUEUE_MAINTENANCE_TICK": "0.5", "QUEUE_MINUTE_RETRY_THREAD": "*/1"}
    workers = [
        start_worker(backend, server, log, "--concurrency", "2", "--batch-size", "4", **ticks)
        for _ in range(3)
    ]
    try:
        wait_for(lambda: log.read_text().count("concurrency 2") == 3, 60, "the workers", log)
        app.enqueue_many(
            None, [{"task": "effect", "payload": {"n": i, "sleep": 0.01}} for i in range(total)]
        )

        def succeeded() -> int:
            return sum(s.counts.get("succeeded", 0) for s in app.stats())

        wait_for(lambda: succeeded() >= total // 4, 120, "a quarter of the jobs", log)
        server.kill()
        wait_for(
            lambda: log.read_text().count("lost the lock server") >= 3,
            60,
            "every worker to notice",
            log,
        )
        # Garbage and silence at the new server change nothing for the workers.
        restarted = own_server(port=server.port)
        with RawClient(restarted.host, restarted.port) as garbage:
            garbage.send_raw(b"\x00\x00\x00\x04junk")
            assert garbage.closed_by_server(timeout=10)
        wait_for(
            lambda: log.read_text().count("reconnected to the lock server") >= 3,
            60,
            "every worker to reconnect",
            log,
        )
        wait_for(lambda: succeeded() == total, 240, "every job to finish", log)
    finally:
        for worker in workers:
            stop(worker, log)
    jobs = backend.jobs()
    assert len(jobs) == total
    assert {j["status"] for j in jobs} == {"succeeded"}, log.read_text()[-4000:]
    rows = effect_rows(backend)
    assert [r[0] for r in rows] == sorted(j["id"] for j in jobs)  # one row each: none twice
    for job in jobs:  # the committed write is the attempt that succeeded
        assert f"attempt {job['attempt']}" in {r[1] for r in rows if r[0] == job["id"]}


@pytest.mark.parametrize("backend", JOB_LOCK_BACKENDS, indirect=True)
def test_a_worker_that_lost_its_lock_never_commits_the_job_another_took_over(
    backend, own_server, tmp_path
):
    """The dangerous case, made deterministic. The server dies while W runs job J; a new server
    starts with another token, so W cannot get back in (as if it could not reach it in time);
    rescue takes J's lock there and retries J; worker X claims J and runs it. Then W's handler
    finishes: its outcome UPDATE (fenced on status 'running' and W's worker id) matches nothing,
    so W rolls back — its write with it — and J's only write is X's."""
    server = own_server(token="first")
    backend = dataclasses.replace(backend, server=server.address)
    app = backend.app()
    started, release = tmp_path / "started", tmp_path / "release"
    job_id = app.enqueue(None, "effect", {"started_file": str(started), "wait_file": str(release)})
    log = tmp_path / "workers.log"
    w = start_worker(backend, server, log, "--no-maintenance")
    x = None
    try:
        wait_for(started.exists, 60, "W's handler to start", log)
        server.kill()
        replacement = own_server(port=server.port, token="second")
        wait_for(lambda: "refused this client" in log.read_text(), 60, "W to be refused", log)

        rescue_app = dataclasses.replace(backend, server=replacement.address).app()
        rescue_app = rescue_app.reconfigured(lock_server_token="second")
        result = rescue_app.run_maintenance("rescue", strategy="lock_server")
        assert result == f"rescued 1 job(s) whose worker died: {job_id}", result

        x = start_worker(backend, replacement, log, "--burst", "--no-maintenance")
        wait_for(
            lambda: (
                (app.get_job(job_id)["status"], app.get_job(job_id)["attempt"]) == ("running", 2)
            ),
            60,
            "X to claim the job",
            log,
        )
        release.touch()  # W's handler returns; X's insert waits for W's row lock meanwhile
        assert x.wait(timeout=120) == 0, log.read_text()[-4000:]
    finally:
        release.touch()
        stop(w, log)
        if x is not None and x.poll() is None:
            x.kill()
    text = log.read_text()
    assert f"rolled back job(s) {job_id}" in text, text[-4000:]
    job = app.get_job(job_id)
    assert (job["status"], job["attempt"]) == ("succeeded", 2)
    assert effect_rows(backend) == [(job_id, "attempt 2", x.pid)]


@pytest.mark.parametrize("backend", JOB_LOCK_BACKENDS, indirect=True)
def test_after_a_server_restart_a_worker_takes_its_locks_back_and_finishes(
    backend, own_server, tmp_path
):
    server = own_server()
    backend = dataclasses.replace(backend, server=server.address)
    app = backend.app()
    started, release = tmp_path / "started", tmp_path / "release"
    job_id = app.enqueue(None, "effect", {"started_file": str(started), "wait_file": str(release)})
    log = tmp_path / "workers.log"
    worker = start_worker(backend, server, log, "--no-maintenance")
    try:
        wait_for(started.exists, 60, "the handler to start", log)
        server.kill()
        restarted = own_server(port=server.port)
        wait_for(lambda: restarted.stats()["locks"] >= 1, 60, "the worker's reclaim", log)
        assert not try_lock(restarted, lock_name(app, job_id))  # held again: rescue keeps off
        release.touch()
        wait_for(lambda: app.get_job(job_id)["status"] == "succeeded", 60, "the job", log)
    finally:
        release.touch()
        stop(worker, log)
    assert "re-acquiring this process's locks" in log.read_text()
    assert app.get_job(job_id)["attempt"] == 1
    assert effect_rows(backend) == [(job_id, "attempt 1", worker.pid)]


@pytest.mark.parametrize("backend", ["sqlite-lock_server"], indirect=True)
def test_a_lock_server_lost_during_a_routine_is_one_warning_and_a_recorded_failure(
    backend, own_server, monkeypatch, caplog
):
    """The routine's lock was taken, then the server died: the tick records the failure and the
    log says why in one line — no traceback, which would read as a bug in dbqueue."""
    from dbqueue.runtime.maintenance import Maintenance

    monkeypatch.setenv("TIMEOUT_SOCKET_MESSAGE", "1")  # how long a request waits to connect
    server = own_server()
    backend = dataclasses.replace(backend, server=server.address)
    app = backend.app()
    job_id = app.enqueue(None, "t", {})
    jobs = app.tables.jobs
    with app.engine.begin() as conn:
        conn.execute(jobs.update().values(status="running", attempt=1, worker_id="ghost:1:0"))
    rescue = Maintenance.rescue

    def rescue_after_the_server_died(self, conn, engine):
        server.kill()
        return rescue(self, conn, engine)

    monkeypatch.setattr(Maintenance, "rescue", rescue_after_the_server_died)
    with caplog.at_level("INFO", logger="dbqueue"):
        result = app.run_maintenance("rescue", strategy="lock_server")
    assert result.startswith("failed: LockServerUnavailableError: cannot reach the lock server")
    assert [r for r in caplog.records if r.exc_info] == []
    assert any("rescue stopped: cannot reach" in r.getMessage() for r in caplog.records)
    assert app.get_job(job_id)["status"] == "running"  # left for the next tick, nothing lost
    status = {row["routine"]: row for row in app.maintenance_status()}
    assert status["rescue"]["result"] == result

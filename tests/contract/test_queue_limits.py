"""Queue limits: at most N jobs of a limited queue run at once across all workers and processes,
and a SIGKILLed holder's slot comes back (``app.queue(name, concurrency=N)``, ``--queue-limit``).

Each run of the test handler records when it started and ended (``support/limits_app.py``), in
its job's transaction; the most runs of one queue that overlap in time must not exceed its limit.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.backends import effect_rows
from support.cli_runner import invoke
from support.waiting import wait_for

import dbqueue

#: Run in the claim's transaction and outside it, under a lease (tests/conftest.py).
BOTH_MODES = True

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
#: Worker processes per pair (two threads each), as the issue asks: four on every pair.
PROCESSES = 4


def start_cli_worker(backend, log: Path, *args: str) -> subprocess.Popen:
    command = [str(Path(sys.executable).parent / "dbqueue"), "worker", "--url", backend.url]
    command += ["--table-prefix", backend.prefix, "--strategy", backend.strategy]
    command += ["--server", backend.server] if backend.server else []
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("DBQUEUE_URL", None)
    return subprocess.Popen(
        [*command, "--app", "support.limits_app:app", *args],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
    )


def runs_by_queue(backend) -> dict[str, list[tuple[float, float]]]:
    """Each recorded run's (start, end), by its job's queue."""
    queue_of = {job["id"]: job["queue"] for job in backend.jobs()}
    runs: dict[str, list[tuple[float, float]]] = {}
    for job_id, note in effect_rows(backend, "job_id", "note"):
        start, end = (float(x) for x in note.split())
        runs.setdefault(queue_of[job_id], []).append((start, end))
    return runs


def most_at_once(runs: list[tuple[float, float]]) -> int:
    """The largest number of runs in progress at the same moment."""
    events = sorted([(start, 1) for start, _ in runs] + [(end, -1) for _, end in runs])
    running = peak = 0
    for _, change in events:  # at equal times an end (-1) sorts before a start (+1)
        running += change
        peak = max(peak, running)
    return peak


def test_limits_of_1_and_3_hold_across_processes_and_a_killed_holder(backend, tmp_path):
    log = tmp_path / "workers.log"
    queues = ["--queue", "exclusive", "--queue", "three", "--queue-limit", "three=3"]
    options = ["--concurrency", "2", "--poll-interval", "0.2", "--no-maintenance"]
    processes = PROCESSES
    workers = [start_cli_worker(backend, log, *queues, *options) for _ in range(processes)]
    killed: subprocess.Popen | None = None
    try:

        def up() -> bool:
            assert all(w.poll() is None for w in workers), log.read_text()[-3000:]
            return log.read_text().count("concurrency 2") == processes

        wait_for(up, 60, "the workers to start", log)
        app = backend.app()
        started, release = tmp_path / "started", tmp_path / "release"
        hold = {"started_file": str(started), "wait_file": str(release)}
        app.enqueue_many(
            None,
            [{"task": "timed", "queue": "exclusive", "payload": hold, "priority": 1}]
            + [{"task": "timed", "queue": "exclusive", "payload": {"sleep": 0.15}}] * 3
            + [{"task": "timed", "queue": "three", "payload": {"sleep": 0.25}}] * 8,
        )
        wait_for(
            lambda: started.exists() and started.read_text().strip(),
            30,
            "the exclusive queue's first job to start",
            log,
        )
        holder = int(started.read_text())
        killed = next(w for w in workers if w.pid == holder)
        time.sleep(0.3)  # the other workers find the exclusive queue's one slot taken
        killed_at = time.time()
        killed.send_signal(signal.SIGKILL)
        assert killed.wait(timeout=10) == -signal.SIGKILL
        release.touch()  # the killed job's next attempt runs through
        victim = next(j["id"] for j in backend.jobs() if j["priority"] == 1)
        if backend.commits_claims:
            # Its slot's lock died with the worker at once; the job waits for rescue (with
            # whatever job the killed worker's other thread was running).
            assert app.get_job(victim)["status"] == "running"

            def rescued() -> bool:  # the lock server may take a moment to see its client gone
                app.run_maintenance("rescue", strategy=backend.strategy)
                return app.get_job(victim)["status"] != "running"

            wait_for(rescued, 30, "rescue to retry the killed holder's job", log, 0.2)

        def finished() -> bool:
            return all(j["status"] == "succeeded" for j in backend.jobs())

        wait_for(finished, 90, "every job to succeed", log)
    finally:
        for worker in workers:
            if worker is not killed:
                worker.send_signal(signal.SIGTERM)
        codes = [w.wait(timeout=60) for w in workers if w is not killed]
    assert codes == [0] * (processes - 1), log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()

    jobs = backend.jobs()
    assert len(jobs) == 12
    # A committed claim counts the killed attempt (the killed worker's other thread may have
    # been running a job too); an in-transaction one rolled it back.
    attempts = {j["id"]: j["attempt"] for j in jobs}
    assert attempts.pop(victim) == (2 if backend.commits_claims else 1)
    assert set(attempts.values()) <= ({1, 2} if backend.commits_claims else {1})
    assert [r[0] for r in effect_rows(backend)] == [j["id"] for j in jobs]  # each run once

    runs = runs_by_queue(backend)
    assert len(runs["exclusive"]) == 4 and len(runs["three"]) == 8
    assert most_at_once(runs["exclusive"]) == 1
    # The killed holder kept the one slot until it died: no other run started before.
    assert min(start for start, _ in runs["exclusive"]) > killed_at
    three_at_once = most_at_once(runs["three"])
    assert three_at_once <= 3
    if not backend.single_writer:  # SQLite runs one job at a time whatever the limit
        assert three_at_once >= 2, runs["three"]

    slots = {(s["queue"], s["slot"]): s for s in slot_rows(backend)}
    assert sorted(slots) == [("exclusive", 0), ("three", 0), ("three", 1), ("three", 2)]
    if backend.commits_claims:  # the holder of a named-lock slot is written down
        queue_of = {j["id"]: j["queue"] for j in jobs}
        # (on SQLite one job runs at a time: a slot of three may never be needed)
        taken = {key: s for key, s in slots.items() if s["job_id"] is not None}
        assert ("exclusive", 0) in taken, slots
        assert all(queue_of[s["job_id"]] == queue for (queue, _), s in taken.items())
        assert all(s["worker_id"] and s["taken_at"] for s in taken.values())


def slot_rows(backend) -> list[dict]:
    engine = backend.engine()
    try:
        with engine.connect() as conn:
            return backend.app().queue_engine(conn).slots.slot_rows(conn)
    finally:
        engine.dispose()


@pytest.fixture(autouse=True)
def _no_slots(request):
    """Each test starts without slot rows (the shared reset leaves that table alone)."""
    names = [n for n in ("backend", "database") if n in request.fixturenames]
    if names:
        backend = request.getfixturevalue(names[0])
        engine = backend.engine()
        try:
            with engine.begin() as conn:
                conn.execute(sa.delete(backend.app().tables.slots))
        finally:
            engine.dispose()


@pytest.mark.parametrize(
    "backend",
    ["postgresql-skip_locked", "mysql-advisory_lock", "singlestore-lock_server"],
    indirect=True,
)
def test_a_worker_that_finds_every_slot_taken_claims_nothing_and_does_not_spin(backend):
    holder_app, other_app = backend.app(), backend.app()
    entered, leave = threading.Event(), threading.Event()
    ran: list[int] = []

    @holder_app.task("hold", queue="exclusive")
    def hold(job, session):
        entered.set()
        leave.wait(30)

    @other_app.task("hold", queue="exclusive")
    def record(job, session):
        ran.append(job.id)

    for app in (holder_app, other_app):
        app.queue("exclusive", concurrency=1)
    first, second = (holder_app.enqueue(None, "hold") for _ in range(2))
    holder = threading.Thread(
        target=backend.run_worker, args=(holder_app,), kwargs={"burst": False, "max_jobs": 1}
    )
    holder.start()
    try:
        assert entered.wait(30), "the holder's job did not start"
        # The database's own idle poll interval (None), as a deployed worker has it.
        summary = backend.run_worker(
            other_app, burst=False, max_runtime=2, concurrency=2, poll_interval=None
        )
    finally:
        leave.set()
        holder.join(30)
    assert ran == [] and summary.processed == 0
    assert summary.rounds <= 30, f"{summary.rounds} claim rounds in 2 s: the worker spun"
    assert backend.app().get_job(first)["status"] == "succeeded"
    backend.run_worker(other_app)  # the holder is done: its slot is free again
    assert ran == [second]


def test_slot_rows_are_made_once_and_a_smaller_limit_says_so(database, caplog):
    app = database.app()
    app.queue("reports", concurrency=3)
    caplog.set_level(logging.INFO, logger="dbqueue.worker")
    database.run_worker(app, queues=["reports"])
    database.run_worker(app, queues=["reports"])  # idempotent: the rows exist
    assert [(s["queue"], s["slot"]) for s in slot_rows(database)] == [
        ("reports", 0),
        ("reports", 1),
        ("reports", 2),
    ]
    assert "queue reports: at most 3 job(s) at once" in caplog.text
    assert "more than this worker's limit" not in caplog.text
    database.run_worker(app, queues=["reports"], queue_limits={"reports": 1})
    assert len(slot_rows(database)) == 3  # the rows are the union of the limits given
    assert "queue reports has 3 slots, more than this worker's limit of 1" in caplog.text


def test_declared_and_given_limits_reach_the_worker(database):
    app = database.app()
    assert app.queue("reports", concurrency=1) == "reports"
    worker = app.worker(queue_limits={"exports": 2})
    assert worker.queue_limits == {"reports": 1, "exports": 2}
    assert {"reports", "exports"} <= set(worker.queues)  # consumed by default
    assert app.worker(queue_limits={"reports": 4}).queue_limits == {"reports": 4}
    assert app.worker(queues=["other"]).queue_limits == {}  # not consumed: no limit
    app.queue("reports")  # no concurrency: no limit
    assert app.queue_limits == {}
    assert app.reconfigured(purge_limit=5).worker(queues=["reports"]).queue_limits == {}


@pytest.mark.parametrize(
    "call, fragments",
    [
        (lambda app: app.queue("reports", concurrency=0), ["concurrency=0", "from 1 to 1000"]),
        (lambda app: app.queue("reports", concurrency=2.5), ["concurrency=2.5", "whole number"]),
        (lambda app: app.queue("a b", concurrency=1), ["queue name 'a b'"]),
        (lambda app: app.worker(queue_limits={"r": True}), ["queue_limits['r']=True"]),
        (
            lambda app: app.worker(queues=["a"], queue_limits={"r": 1}),
            ["does not consume", "r", "--queue"],
        ),
    ],
)
def test_bad_limits_are_refused_in_one_line(tmp_path, call, fragments):
    app = dbqueue.App(f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(dbqueue.ConfigurationError) as raised:
        call(app)
    message = str(raised.value)
    assert "\n" not in message and all(f in message for f in fragments), message


@pytest.mark.parametrize(
    "limit, fragment",
    [
        ("reports", "--queue-limit 'reports': expected QUEUE=N"),
        ("reports=none", "--queue-limit 'reports=none': expected QUEUE=N"),
        ("reports=0", "--queue-limit reports=0: the limit must be a whole number from 1"),
        ("reports=1 --queue-limit reports=2", "names queue 'reports' twice"),
        ("reports=1 --queue other", "does not consume: reports"),
    ],
)
def test_bad_queue_limit_options_print_one_line(tmp_path, limit, fragment):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    dbqueue.App(url).migrate()
    args = ["worker", "--burst", "--url", url, "--queue-limit", *limit.split()]
    outcome = invoke(args, cwd=tmp_path)
    assert outcome.exception is None and outcome.exit_code == 1, outcome
    lines = outcome.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], outcome.stderr

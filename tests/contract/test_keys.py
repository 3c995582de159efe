"""Keys: jobs of one queue sharing a key never run at once, and (key_mode ordered, the default)
run in enqueue order, a failed attempt keeping its place; a SIGKILLed holder's key comes back with
its job, and a long line behind one key never holds up other jobs.

Each run of the test handler records its key, its number in the enqueue order and when it started
and ended (``support/keys_app.py``), in its job's transaction.
"""

from __future__ import annotations

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
from support.waiting import wait_for

import dbqueue
from dbqueue.engine.keys import KeyLines as Keys
from dbqueue.errors import ConfigurationError

#: Run in the claim's transaction and outside it, under a lease (tests/conftest.py).
BOTH_MODES = True

pytestmark = pytest.mark.slow

PROCESSES = 2
TESTS = Path(__file__).resolve().parents[1]


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
        [*command, "--app", "support.keys_app:app", *args],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
    )


def runs_by_key(backend) -> dict[str, list[tuple[int, float, float]]]:
    """Each recorded run's (n, start, end), by key, in order of start."""
    runs: dict[str, list[tuple[int, float, float]]] = {}
    for (note,) in effect_rows(backend, "note"):
        key, n, start, end = note.split()
        runs.setdefault(key, []).append((int(n), float(start), float(end)))
    return {key: sorted(found, key=lambda run: run[1]) for key, found in runs.items()}


def one_at_a_time_in_order(runs: list[tuple[int, float, float]]) -> bool:
    numbers = [n for n, _, _ in runs]
    apart = all(later[1] >= earlier[2] for earlier, later in zip(runs, runs[1:], strict=False))
    return numbers == sorted(numbers) and len(set(numbers)) == len(numbers) and apart


def insert_by_hand(backend, app: dbqueue.App, **values) -> None:
    """A keyed job written by plain SQL (no key_seq): it must obey the key's rules too."""
    engine = app.create_engine()
    try:
        with engine.begin() as conn:
            conn.execute(sa.insert(app.tables.jobs).values(**values))
    finally:
        engine.dispose()


def test_keyed_jobs_run_one_at_a_time_in_order_across_processes_and_a_killed_holder(
    backend, tmp_path
):
    log = tmp_path / "workers.log"
    options = ["--concurrency", "2", "--poll-interval", "0.2", "--no-maintenance"]
    workers = [start_cli_worker(backend, log, *options) for _ in range(PROCESSES)]
    killed: subprocess.Popen | None = None
    try:
        wait_for(
            lambda: log.read_text().count("concurrency 2") == PROCESSES,
            60,
            "the workers to start",
            log,
        )
        app = backend.app()
        # Everything is enqueued before a's head can start: on SQLite its handler holds the
        # database's one write lock while it waits.
        for n in range(3):
            app.enqueue(None, "keyed", {"n": n}, key="c", priority=60)
        insert_by_hand(backend, app, task="keyed", key="c", payload={"n": 3}, priority=60)
        app.enqueue_many(None, [{"task": "plain", "payload": {"n": n}} for n in range(4)])
        started, release = tmp_path / "started", tmp_path / "release"
        hold = {"started_file": str(started), "wait_file": str(release)}
        jobs = [{"task": "keyed", "key": "a", "payload": {"n": 0, **hold}, "priority": 1}]
        for n in range(1, 4):
            jobs.append({"task": "keyed", "key": "a", "payload": {"n": n, "sleep": 0.02}})
        for n in range(4):  # b's second job fails once: b2 and b3 wait for its retry
            payload = {"n": n, "fail_first": n == 1}
            jobs.append({"task": "keyed", "key": "b", "payload": payload, "priority": 60})
        app.enqueue_many(None, jobs)
        wait_for(lambda: started.exists() and started.read_text(), 30, "a's head to start", log)
        killed = next(w for w in workers if w.pid == int(started.read_text()))
        time.sleep(0.3)  # the other workers run everything else meanwhile, but no job of a
        killed_at = time.time()
        killed.send_signal(signal.SIGKILL)
        assert killed.wait(timeout=10) == -signal.SIGKILL
        release.touch()
        if backend.commits_claims:

            def rescued() -> bool:  # the lock server may take a moment to see its client gone
                app.run_maintenance("rescue", strategy=backend.strategy)
                return all(j["status"] != "running" for j in backend.jobs() if j["key"] == "a")

            wait_for(rescued, 30, "rescue to retry the killed holder's job", log, 0.2)
        wait_for(
            lambda: all(j["status"] == "succeeded" for j in backend.jobs()),
            90,
            "every job to succeed",
            log,
            state=lambda: (backend.jobs(), busy_keys(backend)),
        )
    finally:
        for worker in workers:
            if worker is not killed:
                worker.send_signal(signal.SIGTERM)
        codes = [w.wait(timeout=60) for w in workers if w is not killed]
    assert codes == [0] * (PROCESSES - 1), log.read_text()[-3000:]

    rows = backend.jobs()
    assert len(rows) == 16
    assert [r[0] for r in effect_rows(backend)] == [j["id"] for j in rows]  # each ran once
    runs = runs_by_key(backend)
    assert {key: len(found) for key, found in runs.items()} == {"a": 4, "b": 4, "c": 4, "None": 4}
    for key in "abc":
        assert one_at_a_time_in_order(runs[key]), (key, runs[key])
    # While the killed worker held a's head, no other job of a started.
    assert min(start for _, start, _ in runs["a"]) > killed_at
    # b's failed attempt kept its place: b2 and b3 ran after b1's successful retry.
    # (A committed claim also counts the attempt a job of the killed worker's other thread
    # was running, which rescue retried; an in-transaction one rolled it back.)
    b_attempts = [j["attempt"] for j in rows if j["key"] == "b"]
    if backend.commits_claims:
        assert b_attempts[1] >= 2 and set(b_attempts) <= {1, 2, 3}, b_attempts
    else:
        assert b_attempts == [1, 2, 1, 1]
    assert all(j["key_seq"] is not None for j in rows if j["key"] is not None)
    assert busy_keys(backend) == []  # the last job of each key deleted its row


def busy_keys(backend) -> list[tuple]:
    engine = backend.engine()
    try:
        with engine.connect() as conn:
            table = backend.app().tables.keys
            return [tuple(row) for row in conn.execute(sa.select(table.c.queue, table.c["key"]))]
    finally:
        engine.dispose()


def states(backend) -> dict[int, tuple[str, int | None]]:
    return {j["id"]: (j["status"], j["key_seq"]) for j in backend.jobs()}


def test_a_hand_written_row_takes_its_place_in_one_transaction(backend, monkeypatch):
    """The claim that meets a keyed row written by plain SQL gives it its place: the key's new
    last place and the row's ``key_seq`` must commit together. Committed apart (a lock-based
    claim on PostgreSQL commits each statement on its own), the head's end between the two
    found no job behind it, deleted the key's row, and the row stayed blocked for ever."""
    app = backend.app()
    ran: list[int] = []

    @app.task("t")
    def t(job, session):
        ran.append(job.payload)

    for n in range(3):
        app.enqueue(None, "t", n, key="c")
    insert_by_hand(backend, app, task="t", key="c", payload=3)
    seen_elsewhere: list[int | None] = []
    place = Keys._place

    def observed_place(self, conn, job) -> None:
        seen_elsewhere.append(last_place_seen_elsewhere(backend, "c"))
        place(self, conn, job)

    monkeypatch.setattr(Keys, "_place", observed_place)
    backend.drain(app)
    assert seen_elsewhere == [3]  # the place taken was not yet committed alone
    assert ran == [0, 1, 2, 3]
    assert busy_keys(backend) == []


def test_a_head_s_success_and_its_key_s_release_commit_together(backend, monkeypatch):
    """A handler that writes nothing lets a lock-based outcome commit each statement on its
    own (PostgreSQL): the success and the key's release must still commit as one, or a crash
    between them leaves a finished job holding its key's line for ever."""
    app = backend.app()

    @app.task("t")
    def t(job, session):
        return None

    ids = [app.enqueue(None, "t", n, key=f"k{n % 2}") for n in range(4)]
    seen_elsewhere: list[str] = []
    release = Keys.release_keys

    def observed_release(self, conn, jobs) -> None:
        jobs = list(jobs)
        seen_elsewhere.extend(backend.status_seen_elsewhere(job.id) for job in jobs)
        release(self, conn, jobs)

    monkeypatch.setattr(Keys, "release_keys", observed_release)
    backend.drain(app)
    assert len(seen_elsewhere) == 4 and "succeeded" not in seen_elsewhere, seen_elsewhere
    assert [app.get_job(i)["status"] for i in ids] == ["succeeded"] * 4
    assert busy_keys(backend) == []


def test_a_batch_releases_its_keys_in_the_order_an_enqueue_takes_them(backend, monkeypatch):
    """An enqueue of many keys locks their rows in sorted order; a batch's completion that
    locked them in another order deadlocked with it (seen in the chaos suite): it releases
    them sorted too, the idle ones and the promotions alike."""
    app = backend.app(transaction=True)  # a batch's outcomes together: in its transaction

    @app.task("t")
    def t(job, session):
        return None

    for priority, key in enumerate(["k3", "k1", "k4", "k2"]):  # claimed in this order
        app.enqueue_many(None, [{"task": "t", "payload": n, "key": key, "priority": priority}
                                for n in range(2 if key in ("k1", "k4") else 1)])  # fmt: skip
    calls: list[list[str]] = []
    release_keys, release_key = Keys.release_keys, Keys.release_key

    def observed_keys(self, conn, jobs) -> None:
        calls.append([])
        release_keys(self, conn, jobs)

    def observed_key(self, conn, queue, key, seq, job_id):
        if calls:
            calls[-1].append(key)
        return release_key(self, conn, queue, key, seq, job_id)

    monkeypatch.setattr(Keys, "release_keys", observed_keys)
    monkeypatch.setattr(Keys, "release_key", observed_key)
    backend.drain(app, batch_size=10)
    # Batches grow from one job: one had at least three heads, in another order than claimed
    # (where the database has savepoints: without, a job per transaction).
    batched = dbqueue.dialects.for_sqlalchemy(app.engine.dialect).supports_savepoints
    assert max(len(keys) for keys in calls) >= (3 if batched else 1), calls
    assert all(keys == sorted(keys) for keys in calls), calls
    assert busy_keys(backend) == []


def last_place_seen_elsewhere(backend, key: str) -> int | None:
    """The key's ``last_seq`` as another connection sees it (what is committed)."""
    engine = backend.engine()
    try:
        with engine.connect() as conn:
            table = backend.app().tables.keys
            found = conn.execute(sa.select(table.c.last_seq).where(table.c["key"] == key))
            return found.scalar_one_or_none()
    finally:
        engine.dispose()


def test_a_long_line_behind_a_busy_key_holds_up_no_other_job(database):
    """The key's head waits an hour (a delayed job holds its key like a running one); the 100
    jobs behind it stay out of the claimable set, and the other jobs run at once."""
    app = database.app()
    ran: list[str] = []

    @app.task("t")
    def t(job, session):
        ran.append(f"{job.key} {job.payload}")

    head = app.enqueue(None, "t", "head", key="busy", delay=3600)
    app.enqueue_many(None, [{"task": "t", "payload": n, "key": "busy"} for n in range(50)])
    app.enqueue_many(None, [{"task": "t", "payload": n} for n in range(5)])
    app.enqueue(None, "t", "other", key="k2")
    summary = database.run_worker(app)
    assert sorted(ran) == ["None 0", "None 1", "None 2", "None 3", "None 4", "k2 other"]
    assert summary.succeeded == 6
    assert [s for s, _ in states(database).values()].count("blocked") == 50
    assert busy_keys(database) == [("default", "busy")]
    ran.clear()
    assert app.cancel([head]) == {head: "cancelled"}  # the line moves on
    database.drain(app)
    assert ran == [f"busy {n}" for n in range(50)]
    assert busy_keys(database) == []


def test_exclusive_mode_sends_a_failed_attempt_to_the_back_of_the_line(database):
    app = database.app()
    ran: list[tuple[int, int]] = []

    @app.task("x", key_mode="exclusive")
    def x(job, session):
        ran.append((job.payload, job.attempt))
        if job.payload == 0 and job.attempt == 1:
            raise RuntimeError("once")

    app.enqueue_many(None, [{"task": "x", "payload": n, "key": "k"} for n in range(3)])
    database.drain(app)
    assert ran == [(0, 1), (1, 1), (2, 1), (0, 2)]
    assert busy_keys(database) == []


def test_cancel_dead_and_requeue_keep_the_line_moving(database):
    app = database.app()
    ran: list[int] = []

    @app.task("t", max_attempts=1)
    def t(job, session):
        ran.append(job.payload)
        if job.payload == 1:
            raise RuntimeError("dies")

    app.enqueue_many(None, [{"task": "t", "payload": n, "key": "k"} for n in range(5)])
    ids = [j["id"] for j in database.jobs()]  # (MySQL's multi-row INSERT returns no ids)
    assert [s for s, _ in states(database).values()] == ["available"] + ["blocked"] * 4
    assert app.cancel([ids[0], ids[2]]) == {ids[0]: "cancelled", ids[2]: "cancelled"}
    assert states(database)[ids[1]] == ("available", 2)  # the head's cancel promoted the next
    database.drain(app)
    assert ran == [1, 3, 4]  # 1 died, releasing the key; 2 was cancelled while blocked
    assert app.requeue_dead([ids[1]]) == [ids[1]]
    assert states(database)[ids[1]] == ("available", 1)  # an idle key: it heads a new line
    database.drain(app)
    assert ran == [1, 3, 4, 1] and busy_keys(database) == []


def test_concurrent_enqueues_of_one_key_wait_for_each_other(database):
    """The second transaction's enqueue waits on the key's row: if the first rolls back, the
    second job heads the line; if it commits, the second is blocked behind it."""
    app = database.app()
    engine = app.create_engine()
    try:
        for outcome in ("rollback", "commit"):
            database.reset()
            conn = engine.connect()
            trans = conn.begin()
            first = app.enqueue(conn, "t", 1, key="k")
            second: list[int] = []
            other = threading.Thread(
                target=lambda found=second: found.append(app.enqueue(None, "t", 2, key="k"))
            )
            other.start()
            time.sleep(0.3)  # the second enqueue waits for the first transaction
            assert not second
            getattr(trans, outcome)()
            conn.close()
            other.join(30)
            found = states(database)
            if outcome == "rollback":
                assert found == {second[0]: ("available", 1)}
            else:
                assert found == {first: ("available", 1), second[0]: ("blocked", 2)}
    finally:
        engine.dispose()


def test_bad_keys_and_key_modes_are_refused_with_the_fix(database):
    app = database.app()
    with pytest.raises(ConfigurationError, match="key='' is empty"):
        app.enqueue(None, "t", key="")
    with pytest.raises(ConfigurationError, match="key is 256 characters long; the limit is 255"):
        app.enqueue(None, "t", key="x" * 256)
    with pytest.raises(ConfigurationError, match="key_mode='fifo' is not one of"):
        app.task("t", key_mode="fifo")
    assert database.jobs() == []

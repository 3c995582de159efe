"""Unique jobs: ``enqueue(..., unique_key=…, on_conflict="skip" | "replace" | "rerun")``.

The key is unique among the queue's unfinished jobs, decided by the database (a primary key
written in the enqueue's transaction): concurrent producer processes leave one job, a rolled-back
enqueue holds nothing, and a finished job gives its key up — or hands it to the one follow-up
that ``rerun`` enqueues asked for while it ran.
"""

from __future__ import annotations

import multiprocessing
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
from dbqueue.engine.unique import UniqueKeys as UniqueRelease

#: Run in the claim's transaction and outside it, under a lease (tests/conftest.py).
BOTH_MODES = True

pytestmark = pytest.mark.slow

SUPPORT = Path(__file__).resolve().parents[1] / "support"
PRODUCERS = 8  # the figure
KEYS = 6


def keyed(app: dbqueue.App, key: str) -> list[dict]:
    """The jobs that carry ``key``, by id."""
    j = app.tables.jobs
    with app.engine.connect() as conn:
        rows = conn.execute(sa.select(j).where(j.c.unique_key == key).order_by(j.c.id))
        return [dict(row._mapping) for row in rows]


def holder(app: dbqueue.App, key: str, queue: str = "default") -> int | None:
    u = app.tables.unique
    with app.engine.connect() as conn:
        return conn.execute(
            sa.select(u.c.job_id).where(u.c.queue == queue, u.c.unique_key == key)
        ).scalar()


def produce(url: str, prefix: str, go: str, mode: str, rollback: bool, out) -> None:
    """One producer process: one enqueue per key, each in its own transaction, held open a
    moment so that the producers' transactions overlap (then committed, or rolled back)."""
    app = dbqueue.App(url, table_prefix=prefix)
    engine = app.create_engine()
    with engine.connect():
        pass
    while not Path(go).exists():
        time.sleep(0.002)
    returned = {}
    for n in range(KEYS):
        key = f"invoice:{n}"
        for _ in range(10):
            try:
                returned[key] = enqueue_once(app, engine, key, mode, rollback)
                break
            except sa.exc.OperationalError as exc:
                # InnoDB: a transaction that inserted the key rolls back while two others wait
                # for it; it makes one of them a deadlock victim, rolled back whole (MySQL's own
                # manual shows this case). Like any MySQL application, retry the transaction.
                if not dbqueue.dialects.for_sqlalchemy(engine.dialect).is_transient(exc):
                    raise
    engine.dispose()
    out.put((os.getpid(), rollback, returned))


def enqueue_once(app: dbqueue.App, engine: sa.Engine, key: str, mode: str, rollback: bool) -> int:
    with engine.connect() as conn:
        transaction = conn.begin()
        job_id = app.enqueue(conn, "effect", {"pid": os.getpid()}, unique_key=key, on_conflict=mode)
        time.sleep(0.01)
        transaction.rollback() if rollback else transaction.commit()
    return job_id


def test_concurrent_producer_processes_leave_one_job_per_key(database, tmp_path):
    """8 processes enqueue the same keys at once, each in its own transaction (two of them
    roll back): one job per key, and every committed enqueue got that job's id."""
    go = tmp_path / "go"
    forked = multiprocessing.get_context("fork")  # real processes, without a fresh import each
    out = forked.Queue()
    modes = ["skip", "replace", "rerun"]
    producers = [
        forked.Process(
            target=produce,
            args=(database.url, database.prefix, str(go), modes[n % 3], n in (0, 5), out),
        )
        for n in range(PRODUCERS)
    ]
    for producer in producers:
        producer.start()
    go.write_text("go")
    results = [out.get(timeout=180) for _ in producers]
    for producer in producers:
        producer.join(30)
    assert [p.exitcode for p in producers] == [0] * PRODUCERS
    assert len({pid for pid, _, _ in results}) == PRODUCERS
    app = database.app()
    for n in range(KEYS):
        key = f"invoice:{n}"
        jobs = keyed(app, key)
        assert len(jobs) == 1, (key, jobs)
        assert holder(app, key) == jobs[0]["id"]
        committed = {returned[key] for _, rollback, returned in results if not rollback}
        assert committed == {jobs[0]["id"]}, (key, committed, jobs)


def test_a_rolled_back_enqueue_holds_nothing(database):
    """The second enqueue waits for the first transaction; when it rolls back, the second
    one gets the key (a job of its own), never a "conflict" with the rolled-back job."""
    app = database.app()
    engine = app.create_engine()
    try:
        first = engine.connect()
        transaction = first.begin()
        rolled_back = app.enqueue(first, "t", {"n": 1}, unique_key="k")
        found: list[int] = []
        second = threading.Thread(
            target=lambda: found.append(app.enqueue(None, "t", {"n": 2}, unique_key="k"))
        )
        second.start()
        second.join(0.5)
        assert second.is_alive()  # it waits for the first transaction's key
        transaction.rollback()
        first.close()
        second.join(30)
        assert not second.is_alive()
    finally:
        engine.dispose()
    jobs = keyed(app, "k")
    assert [j["id"] for j in jobs] == found
    assert jobs[0]["payload"] == {"n": 2}
    assert rolled_back not in found or database.reuses_rolled_back_ids


def test_skip_replace_and_rerun_while_the_holder_waits(database):
    app = database.app()
    first = app.enqueue(None, "t", {"v": 1}, unique_key="invoice:42")
    assert app.enqueue(None, "t", {"v": 2}, unique_key="invoice:42") == first  # skip: default
    assert app.get_job(first)["payload"] == {"v": 1}
    before = app.get_job(first)["run_at"]
    assert app.enqueue(None, "t", {"v": 3}, unique_key="invoice:42", on_conflict="replace",
                       delay=3600) == first  # fmt: skip
    job = app.get_job(first)
    assert job["payload"] == {"v": 3} and (job["run_at"] - before).total_seconds() > 3000
    assert app.enqueue(None, "t", {"v": 4}, unique_key="invoice:42", on_conflict="rerun") == first
    job = app.get_job(first)  # the holder waits: rerun acts as replace (due now, no delay)
    assert job["payload"] == {"v": 4} and (job["run_at"] - before).total_seconds() < 600
    assert len(keyed(app, "invoice:42")) == 1
    # Another queue has keys of its own.
    other = app.enqueue(None, "t", {"v": 5}, unique_key="invoice:42", queue="other")
    assert other != first and holder(app, "invoice:42", "other") == other


def test_a_holder_s_success_and_its_key_s_release_commit_together(backend, monkeypatch):
    """As a key's line (test_keys): where the outcome's statements could each commit on their
    own, the success and the unique key's release still commit as one, or a crash between
    them leaves the key held by a finished job, turning every later enqueue of it away."""
    app = backend.app()

    @app.task("t")
    def t(job, session):
        return None

    ids = [app.enqueue(None, "t", {"n": n}, unique_key=f"u{n}") for n in range(3)]
    seen_elsewhere: list[str] = []
    release = UniqueRelease.release_unique

    def observed_release(self, conn, held) -> None:
        seen_elsewhere.extend(backend.status_seen_elsewhere(job_id) for _, _, job_id in held)
        release(self, conn, held)

    monkeypatch.setattr(UniqueRelease, "release_unique", observed_release)
    backend.drain(app)
    assert len(seen_elsewhere) == 3 and "succeeded" not in seen_elsewhere, seen_elsewhere
    assert [app.get_job(i)["status"] for i in ids] == ["succeeded"] * 3
    assert [holder(app, f"u{n}") for n in range(3)] == [None] * 3


def test_keys_are_released_when_the_holder_finishes(backend):
    app = backend.app(max_attempts=1)

    @app.task("ok")
    def ok(job, session):
        return None

    @app.task("boom")
    def boom(job, session):
        raise RuntimeError("boom")

    done = app.enqueue(None, "ok", {}, unique_key="a")
    dead = app.enqueue(None, "boom", {}, unique_key="b")
    backend.drain(app)
    assert app.get_job(done)["status"] == "succeeded" and app.get_job(dead)["status"] == "dead"
    assert holder(app, "a") is None and holder(app, "b") is None  # released
    again = app.enqueue(None, "ok", {}, unique_key="a")
    assert again != done
    # A dead job comes back with its key, unless another unfinished job holds it now.
    blocker = app.enqueue(None, "ok", {}, unique_key="b")
    assert app.requeue_dead([dead]) == []
    assert app.get_job(dead)["status"] == "dead"
    assert app.cancel([blocker])  # a cancelled waiting job gives its key up too
    assert holder(app, "b") is None
    assert app.requeue_dead([dead]) == [dead]
    assert holder(app, "b") == dead


def start_worker(backend, log: Path) -> subprocess.Popen:
    command = [sys.executable, str(SUPPORT / "worker_process.py"), backend.url, backend.strategy]
    return subprocess.Popen(
        [*command, *backend.worker_args(), "--batch-size", "1"],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def test_rerun_while_the_holder_runs_in_a_worker_schedules_one_follow_up(backend, tmp_path):
    """A worker process runs the holder; skip and replace leave it alone, three reruns make
    one follow-up carrying the newest payload, which runs after the holder finished."""
    app = backend.app()
    started, release = tmp_path / "started", tmp_path / "release"
    payload = {"started_file": str(started), "wait_before_write": str(release)}
    first = app.enqueue(None, "effect", payload, unique_key="doc:7")
    log = tmp_path / "worker.log"
    worker = start_worker(backend, log)
    try:
        wait_for(started.exists, 60, "the holder to start", log)
        if backend.single_writer:
            follow = [enqueue_while_the_batch_holds_the_write_lock(app, release)]
        else:
            assert app.enqueue(None, "effect", {"v": 1}, unique_key="doc:7") == first
            replaced = app.enqueue(
                None, "effect", {"v": 2}, unique_key="doc:7", on_conflict="replace"
            )
            assert replaced == first
            follow = [
                app.enqueue(None, "effect", {"v": v}, unique_key="doc:7", on_conflict="rerun")
                for v in (3, 4, 5)
            ]
            assert app.get_job(follow[0])["status"] == "available"
            release.write_text("go")
        assert len(set(follow)) == 1 and follow[0] != first
        wait_for(lambda: app.get_job(follow[0])["status"] == "succeeded", 60, "the follow-up", log)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log.read_text()[-3000:]
    holder_job, follow_job = app.get_job(first), app.get_job(follow[0])
    assert holder_job["payload"] == payload  # replace did not touch the running job
    assert follow_job["payload"] == {"v": 5}
    assert follow_job["started_at"] >= holder_job["finished_at"]
    assert [r[0] for r in effect_rows(backend)] == [first, follow[0]]
    assert len(keyed(app, "doc:7")) == 2 and holder(app, "doc:7") is None


def enqueue_while_the_batch_holds_the_write_lock(app: dbqueue.App, release: Path) -> int:
    """On SQLite a running job's transaction holds the database's one write lock (BEGIN
    IMMEDIATE, whatever the strategy): an enqueue waits for the job to end, and then finds the
    key free — no job is ever seen running, so rerun makes a job of its own."""
    found: list[int] = []
    enqueue = threading.Thread(
        target=lambda: found.append(
            app.enqueue(None, "effect", {"v": 5}, unique_key="doc:7", on_conflict="rerun")
        )
    )
    enqueue.start()
    enqueue.join(0.5)
    assert enqueue.is_alive()
    release.write_text("go")
    enqueue.join(30)
    return found[0]


def test_enqueue_many_publish_and_bad_input(database):
    app = database.app()
    ids = app.enqueue_many(
        None,
        [
            {"task": "t", "payload": 1, "unique_key": "m"},
            {"task": "t", "payload": 2, "unique_key": "m", "on_conflict": "replace"},
            {"task": "t", "payload": 3},
        ],
    )
    assert ids[0] == ids[1] != ids[2] and app.get_job(ids[0])["payload"] == 2
    with pytest.raises(dbqueue.ConfigurationError, match="on_conflict='merge' is not one of"):
        app.enqueue(None, "t", unique_key="x", on_conflict="merge")
    with pytest.raises(dbqueue.ConfigurationError, match="needs a unique_key"):
        app.enqueue(None, "t", on_conflict="skip")
    with pytest.raises(dbqueue.ConfigurationError, match="publish.. takes no unique_key"):
        app.publish(None, "topic", {}, unique_key="x")
    with pytest.raises(dbqueue.ConfigurationError, match="unique_key is 256 characters long"):
        app.enqueue(None, "t", unique_key="k" * 256)


def test_cli_enqueue_unique_key(database, tmp_path):
    args = ["enqueue", "--url", database.url, "--table-prefix", database.prefix, "t"]
    first = invoke(
        [*args, "--payload", '{"a": 1}', "--unique-key", "c:1"], tmp_path, database.env()
    )
    assert first.exit_code == 0, first.stderr
    again = [*args, "--payload", '{"a": 2}', "--unique-key", "c:1", "--on-conflict", "replace"]
    second = invoke(again, tmp_path, database.env())
    assert second.exit_code == 0, second.stderr
    assert first.stdout.strip() == second.stdout.strip()
    [job] = keyed(database.app(), "c:1")
    assert job["payload"] == {"a": 2}

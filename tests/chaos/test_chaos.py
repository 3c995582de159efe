"""Chaos: worker processes drain thousands of jobs while the test kills and restarts things.

For each (database, claim strategy) in CASES, WORKERS worker processes drain JOBS jobs whose
handler writes a row in the job's transaction. As the work progresses the test SIGKILLs a random
worker (and starts a new one in its place) at each KILL_AT fraction, and crash-restarts the
database server once at RESTART_AT (a private server: the shared ones serve other suites), then
enqueues the second half of the jobs. At the end: every job succeeded and committed exactly one
handler row, nothing is left running or waiting, every surviving worker stops cleanly on SIGTERM,
and no worker's log holds a traceback. Every fourth job has one of 20 keys: per key, the runs
follow enqueue order and never overlap. The counts go to the "dbqueue chaos" section of the
terminal summary.

Where a private server cannot run (its binaries are missing), the case runs against the shared
server and only the restart step is skipped, with a warning and a SKIPPED note in the summary.

Adding a pair is one line in CASES. A strategy with a server of its own (the lock server) lists
it in ``services``; SERVICE_RESTARTS maps such a name to the fixture-provided function that
restarts it, and the test restarts each listed service once, at its own point of the run.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from support.backends import (
    MYSQL_URL,
    POSTGRESQL_URL,
    PREFIX,
    drop_queue_tables,
    requires_backend,
)
from support.chaos_worker import runs_metadata, runs_table
from support.lockserver import ServerProcess, start_server
from support.private_servers import private_server
from support.waiting import wait_for

import dbqueue
from dbqueue.migrations import migrate

pytestmark = pytest.mark.slow

WORKER = Path(__file__).resolve().parents[1] / "support" / "chaos_worker.py"
CHAOS_PREFIX = f"{PREFIX}chaos_"
JOBS = 2000
WORKERS = 4
#: Progress (committed runs / JOBS) at which a random worker is SIGKILLed and replaced.
KILL_AT = (0.05, 0.15, 0.25, 0.35, 0.6, 0.7, 0.8, 0.9)
#: The leased cases' jobs and kills.
LEASED_JOBS = 1000
LEASED_KILL_AT = (0.1, 0.3, 0.6, 0.85)
#: Progress at which the database server crash-restarts; the second half is enqueued after it.
RESTART_AT = 0.45
SHARED_URLS = {"postgresql": POSTGRESQL_URL, "mysql": MYSQL_URL}


@dataclass(frozen=True)
class Case:
    database: str
    strategy: str
    #: Servers besides the database that the strategy depends on, each restarted once.
    services: tuple[str, ...] = field(default=())
    #: "async": the handler is an async def (an async worker: slots on an event loop).
    handlers: str = "sync"
    #: "leased": the jobs run outside their claim's transaction, under a lease.
    mode: str = "in_transaction"
    #: How many jobs, and at which progress a worker is killed (the leased cases are leaner:
    #: each kill leaves its jobs waiting for their lease to end).
    jobs: int = JOBS
    kill_at: tuple[float, ...] = KILL_AT

    @property
    def id(self) -> str:
        suffix = "-async" if self.handlers == "async" else ""
        suffix += "-leased" if self.leased else ""
        return f"{self.database}-{self.strategy}{suffix}"

    @property
    def leased(self) -> bool:
        return self.mode == "leased"


def leased(database: str, strategy: str, services: tuple[str, ...] = ()) -> Case:
    """A pair's case with its jobs run outside their claim's transaction."""
    return Case(
        database, strategy, services, mode="leased", jobs=LEASED_JOBS, kill_at=LEASED_KILL_AT
    )


CASES = [
    Case("postgresql", "skip_locked"),
    Case("postgresql", "advisory_lock"),
    Case("mysql", "skip_locked"),
    Case("mysql", "advisory_lock"),
    Case("sqlite", "sqlite"),
    Case("postgresql", "lock_server", ("lock_server",)),
    Case("mysql", "lock_server", ("lock_server",)),
    # Its locks are taken before the claim's write transaction (outside SQLite's write lock).
    Case("sqlite", "lock_server", ("lock_server",)),
    # An async pair per database: the same claims and outcomes, driven from an event loop
    # (the asyncio lock-server client, PostgreSQL's lock server restarted under it).
    Case("postgresql", "lock_server", ("lock_server",), handlers="async"),
    Case("mysql", "skip_locked", handlers="async"),
    Case("sqlite", "sqlite", handlers="async"),
    # Outside the claim's transaction: every pair. A handler's run may commit and its worker die
    # before the outcome: the job then runs again (at least once), never at once with itself.
    leased("postgresql", "skip_locked"),
    leased("postgresql", "advisory_lock"),
    leased("postgresql", "lock_server", ("lock_server",)),
    leased("mysql", "skip_locked"),
    leased("mysql", "advisory_lock"),
    leased("mysql", "lock_server", ("lock_server",)),
    leased("sqlite", "sqlite"),
    leased("sqlite", "lock_server", ("lock_server",)),
]

#: service name → progress at which to restart it (the restart itself comes from a fixture).
SERVICE_RESTART_AT: dict[str, float] = {"lock_server": 0.3}


@dataclass
class Target:
    url: str
    restart: Callable[[], None] | None
    no_restart_reason: str | None


@pytest.fixture
def target(case: Case, private_servers, tmp_path) -> Target:
    if case.database == "sqlite":
        return Target(f"sqlite:///{tmp_path / 'chaos.db'}", None, "embedded: no server")
    server = private_server(private_servers, case.database)
    if isinstance(server, str):
        url = SHARED_URLS[case.database]
        requires_backend(case.database, url)  # neither a private nor the shared server
        reason = f"no private {case.database} server ({server}): restart step SKIPPED"
        warnings.warn(f"chaos {case.id}: {reason}", stacklevel=1)
        sys.stderr.write(f"\n{'!' * 78}\n!! CHAOS {case.id}: {reason}\n{'!' * 78}\n")
        return Target(url, None, reason)
    return Target(server.url, server.restart, None)  # type: ignore[attr-defined]


class LockServer:
    """The case's `dbqueue server`: SIGKILLed and started again on the same port to restart."""

    def __init__(self, url: str, log: Path) -> None:
        self.url, self.log = url, log
        self.process: ServerProcess = start_server(url, CHAOS_PREFIX, log)

    @property
    def address(self) -> str:
        return self.process.address

    def restart(self) -> None:
        port = self.process.port
        self.process.kill()
        self.process = start_server(self.url, CHAOS_PREFIX, self.log, port=port)

    def stop(self) -> None:
        self.process.stop()


@pytest.fixture
def services(case: Case, target: Target, tmp_path) -> Iterator[dict[str, LockServer]]:
    """The case's servers besides the database (started on the fresh tables' database)."""
    started: dict[str, LockServer] = {}
    if "lock_server" in case.services:
        fresh_tables(target.url)  # the server checks the schema when it starts
        started["lock_server"] = LockServer(target.url, tmp_path / "lockserver.log")
    yield started
    for server in started.values():
        server.stop()


@pytest.fixture(params=CASES, ids=lambda case: case.id)
def case(request) -> Case:
    return request.param


class Progress:
    """Reads the run table through its own engine; a database mid-restart reads as None."""

    def __init__(self, url: str, runs: sa.Table, jobs: sa.Table) -> None:
        self.engine = sa.create_engine(url, poolclass=sa.NullPool)
        self.runs, self.jobs = runs, jobs

    def committed_runs(self) -> int | None:
        try:
            with self.engine.connect() as conn:
                return conn.execute(sa.select(sa.func.count()).select_from(self.runs)).scalar()
        except sa.exc.DBAPIError:
            return None

    def statuses(self) -> dict[str, int] | None:
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    sa.select(self.jobs.c.status, sa.func.count()).group_by(self.jobs.c.status)
                )
                return {status: n for status, n in rows}
        except sa.exc.DBAPIError:
            return None


class Workers:
    def __init__(self, case: Case, url: str, logs: Path, server: str | None = None) -> None:
        self.url, self.strategy, self.logs = url, case.strategy, logs
        self.server_args = ["--server", server] if server else []
        if case.handlers == "async":
            self.server_args.append("--async-handlers")
        if case.leased:
            self.server_args.append("--leased")
        self.started: list[subprocess.Popen] = []
        self.killed: list[subprocess.Popen] = []

    def start(self) -> None:
        log = (self.logs / f"worker-{len(self.started)}.log").open("wb")
        self.started.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), self.url, self.strategy, CHAOS_PREFIX]
                + self.server_args,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )

    def live(self) -> list[subprocess.Popen]:
        return [p for p in self.started if p.poll() is None]

    def kill_one(self, rng: random.Random) -> None:
        victim = rng.choice(self.live())
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        self.killed.append(victim)

    def log_of(self, process: subprocess.Popen) -> str:
        index = self.started.index(process)
        return (self.logs / f"worker-{index}.log").read_text(errors="replace")

    def wait_until_up(self) -> list[subprocess.Popen]:
        """Wait until every live worker has started (connected, signal handlers installed)."""
        live = self.live()
        for process in live:
            wait_for(lambda p=process: "concurrency 2," in self.log_of(p), 60, "a worker to start")
        return live

    def stop_all(self) -> dict[int, int]:
        """SIGTERM every live worker once it is up (before that, SIGTERM is not yet handled);
        returns pid → exit code."""
        survivors = self.wait_until_up()
        for process in survivors:
            process.send_signal(signal.SIGTERM)
        return {p.pid: p.wait(timeout=60) for p in survivors}

    def kill_all(self) -> None:
        for process in self.live():
            process.kill()
            process.wait(timeout=30)


def fresh_tables(url: str) -> tuple[dbqueue.App, sa.Table]:
    app = dbqueue.App(url, table_prefix=CHAOS_PREFIX)
    engine = app.create_engine()
    runs = runs_table(CHAOS_PREFIX)
    try:
        drop_queue_tables(engine, CHAOS_PREFIX)
        runs_metadata.drop_all(engine, tables=[runs])
        migrate.upgrade(engine, app.names)
        runs_metadata.create_all(engine, tables=[runs])
    finally:
        engine.dispose()
    return app, runs


#: Every KEYED_EVERY-th job has one of KEYS keys: per key, the runs must follow enqueue order
#: and never overlap, through the kills and restarts.
KEYED_EVERY = 4
KEYS = 20


def enqueue(app: dbqueue.App, count: int, first: int = 0) -> None:
    jobs = []
    for n in range(first, first + count):
        job: dict = {"task": "chaos", "payload": {"n": n}}
        if n % KEYED_EVERY == 0:
            job["key"] = f"k{n // KEYED_EVERY % KEYS}"
        jobs.append(job)
    app.enqueue_many(None, jobs)


def key_violations(rows: list, reruns: bool = False) -> list[str]:
    """Per key, runs in order of start must have increasing numbers and must not overlap;
    ``reruns``: a job may run again right after itself (at least once)."""
    by_key: dict[str, list] = {}
    for row in rows:
        by_key.setdefault(row.key, []).append(row)
    problems = []
    for key, runs in by_key.items():
        runs.sort(key=lambda run: run.started)
        for earlier, later in zip(runs, runs[1:], strict=False):
            if later.n < earlier.n or (later.n == earlier.n and not reruns):
                problems.append(f"{key}: job n={later.n} ran after n={earlier.n}")
            if later.started < earlier.ended:
                problems.append(f"{key}: n={later.n} started before n={earlier.n} ended")
    return problems


def runs_at_once(rows: list) -> list[str]:
    """Runs of the same job that overlapped (a job must never run twice at once)."""
    by_job: dict[int, list] = {}
    for row in rows:
        by_job.setdefault(row.job_id, []).append(row)
    problems = []
    for job_id, runs in by_job.items():
        runs.sort(key=lambda run: run.started)
        for earlier, later in zip(runs, runs[1:], strict=False):
            if later.started < earlier.ended:
                problems.append(f"job {job_id}: a run started before another had ended")
    return problems


def fence_breaks(rows: list, jobs: list) -> list[str]:
    """Jobs whose outcome was not written by the worker of their last run: a stale worker's
    outcome overwrote a newer attempt's."""
    last: dict[int, Any] = {}
    for row in sorted(rows, key=lambda run: run.started):
        last[row.job_id] = row
    return [
        f"job {job.id}: succeeded under {job.worker_id}, last run by pid {last[job.id].pid}"
        for job in jobs
        if job.id in last and f":{last[job.id].pid}:" not in f"{job.worker_id}"
    ]


def diagnosis(progress: Progress, workers: Workers, services: dict[str, LockServer]) -> str:
    """What a stuck run looks like: job statuses, and the end of every log."""
    parts = [f"statuses {progress.statuses()}"]
    for process in workers.live():
        parts.append(f"--- worker {process.pid}:\n{workers.log_of(process)[-1500:]}")
    for name, server in services.items():
        parts.append(f"--- {name}:\n{server.process.tail()[-1500:]}")
    return "\n".join(parts)


def test_chaos_loses_nothing_and_runs_nothing_twice(case, target, services, tmp_path, chaos_report):
    seed = int(os.environ.get("DBQUEUE_CHAOS_SEED") or time.time_ns() % 1_000_000)
    rng = random.Random(seed)
    app, runs = fresh_tables(target.url)
    progress = Progress(target.url, runs, app.tables.jobs)
    lock_server = services.get("lock_server")
    workers = Workers(case, target.url, tmp_path, lock_server.address if lock_server else None)
    first_half = case.jobs // 2
    enqueue(app, first_half)
    for _ in range(WORKERS):
        workers.start()

    kills = list(case.kill_at)
    restarts: dict[str, float] = {"database": RESTART_AT} if target.restart else {}
    restarts.update({name: SERVICE_RESTART_AT[name] for name in case.services})
    restarted: list[str] = []
    second_half_at = RESTART_AT
    started = time.monotonic()
    try:
        while kills or restarts or second_half_at is not None:
            done = progress.committed_runs()
            if done is None:  # the database is restarting
                time.sleep(0.05)
                continue
            assert time.monotonic() - started < 240, f"no progress past {done}/{case.jobs} runs"
            fraction = done / case.jobs
            if kills and fraction >= kills[0]:
                kills.pop(0)
                workers.kill_one(rng)
                workers.start()
            for name, at in list(restarts.items()):
                if fraction >= at:
                    del restarts[name]
                    # Workers that are still starting would stop with "cannot connect"
                    # (start-up fails fast, by design): restart once they all run.
                    workers.wait_until_up()
                    if name == "database":
                        target.restart()  # crash, then start on the same data directory
                    else:
                        services[name].restart()  # SIGKILL, then start on the same port
                    restarted.append(name)
            if (
                second_half_at is not None
                and fraction >= second_half_at
                and not restarts.get("database")
            ):
                second_half_at = None
                enqueue(app, case.jobs - first_half, first=first_half)
            time.sleep(0.02)

        def drained() -> bool:
            statuses = progress.statuses()
            return statuses is not None and statuses.get("succeeded", 0) == case.jobs

        try:
            wait_for(drained, 240, f"all {case.jobs} jobs to succeed")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {diagnosis(progress, workers, services)}") from None
        codes = workers.stop_all()
    finally:
        workers.kill_all()

    engine = sa.create_engine(target.url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            all_runs = conn.execute(
                sa.select(runs.c.job_id, runs.c.pid, runs.c.started, runs.c.ended)
            ).all()
            run_job_ids = [run.job_id for run in all_runs]
            keyed_runs = conn.execute(
                sa.select(runs.c["key"], runs.c.n, runs.c.started, runs.c.ended).where(
                    runs.c["key"].isnot(None)
                )
            ).all()
            jobs = conn.execute(
                sa.select(
                    app.tables.jobs.c.id,
                    app.tables.jobs.c.status,
                    app.tables.jobs.c.attempt,
                    app.tables.jobs.c.worker_id,
                )
            ).all()
    finally:
        engine.dispose()
    job_ids = {j.id for j in jobs}
    lost = len(job_ids - set(run_job_ids)) + sum(1 for j in jobs if j.status != "succeeded")
    twice = len(run_job_ids) - len(set(run_job_ids))
    retried = sum(1 for j in jobs if j.attempt > 1)
    key_problems = key_violations(keyed_runs, reruns=case.leased)
    at_once = runs_at_once(all_runs)
    broken = fence_breaks(all_runs, jobs)
    restart_note = (
        f"{len(restarted)} restart(s) survived ({', '.join(restarted)})"
        if restarted
        else f"0 restarts ({target.no_restart_reason})"
    )
    chaos_report.append(
        f"{case.id}: {len(jobs)} jobs, {len(run_job_ids)} runs committed, "
        f"{len(workers.killed)} workers SIGKILLed, {restart_note}, lost {lost}, run twice {twice}; "
        f"{retried} jobs needed another attempt; {len(keyed_runs)} keyed runs on {KEYS} keys, "
        f"{len(key_problems)} out of order or overlapping; {len(at_once)} run at once with "
        f"themselves, {len(broken)} outcomes by a stale worker; seed {seed}, "
        f"{time.monotonic() - started:.0f}s"
    )

    assert len(jobs) == case.jobs
    assert at_once == [] and broken == [], (at_once[:20], broken[:20])
    # At least once outside the transaction: a run may commit before its worker dies.
    assert lost == 0 and (twice == 0 or case.leased), (lost, twice)
    keyed_jobs = case.jobs // KEYED_EVERY
    assert len(keyed_runs) == keyed_jobs or (case.leased and len(keyed_runs) > keyed_jobs)
    assert key_problems == [], key_problems[:20]
    if not case.leased:
        assert sorted(run_job_ids) == sorted(job_ids)  # one committed handler row per job
    assert {j.status for j in jobs} == {"succeeded"}  # nothing left running or available
    assert set(codes.values()) == {0}, codes
    assert len(workers.killed) == len(case.kill_at)
    for process in workers.started:
        log = workers.log_of(process)
        assert "Traceback" not in log, f"worker {process.pid}:\n{log[-4000:]}"
    for process in workers.live() or [p for p in workers.started if p not in workers.killed]:
        assert "SUMMARY" in workers.log_of(process)

"""W1 — throughput: enqueue 20,000 no-op jobs, then one worker process drains them.

    python -m benchmarks.throughput postgresql|mariadb|sqlite [--jobs 20000] [--single 2000]
        [--chunk 1000] [--concurrency 4] [--batch-size 10] [--strategy NAME] [--rounds 3]
        [--job-log [--prefix bench_]] [--queue-limit N [--strategy NAME]] [--registry]

Enqueue: the first ``single`` jobs one per transaction, three ways — ``app.enqueue`` on one
Connection, ``app.enqueue(None, …)`` (dbqueue's own transaction on the App's pooled engine) and
``app.enqueue(session, …)`` + ``session.commit()`` — in blocks of 200 alternating with the bare
INSERT+COMMIT on one connection of the same driver, and with SQLAlchemy's floors (the bare
INSERT through a Connection, the App's Engine and a Session, no dbqueue); the rest with
``app.enqueue_many``, ``chunk`` jobs per call and transaction, call by call in turn with the
bare multi-row INSERT (each given its input ready-made: encoded rows, job dicts). Processing:
one worker process (``benchmarks.worker_proc``, ``--burst``) with ``concurrency`` threads drains
the table. The ceiling runs the same work as bare SQL through the same driver
(``benchmarks.ceiling``), with the same concurrency and batch size, on the same freshly filled
table. Each of ``rounds`` rounds measures dbqueue and then bare SQL; the figures are the medians.

``--job-log`` measures instead what the per-job log line (``--log-jobs``) costs processing: each
round drains a freshly filled table once without and once with it, in alternating order. Both
runs log JSON at INFO to stderr, a pipe the benchmark reads (as a container runtime would): the
only difference is the job lines.

``--queue-limit N`` measures instead the processing of a queue limited to N running jobs (the
W1 jobs' queue, ``default``) next to the same queue unlimited: each round drains a freshly
filled table once each way, in alternating order, with the same worker process. A limited
queue's claims take a slot and one job each (a batch runs its jobs one after another, so a
slot per batch would leave the others idle), so this is the price of the limit per job.

``--registry`` measures instead what the registry of live workers and the Prometheus metrics
cost processing: each round drains a freshly filled table with the heartbeat all but off (one
beat an hour: only the row's insert at start and delete at exit), at its default (every 5 s),
every 0.5 s, and at the default with the Prometheus counters on, in alternating order.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from benchmarks import ceiling
from benchmarks.common import PREFIX, URLS, fresh_app, lock_server, machine, save, server_version
from dbqueue.base import payload as payload_codec

HERE = Path(__file__).resolve().parent


def run_worker_process(url: str, *args: str) -> dict[str, Any]:
    """Run ``benchmarks.worker_proc`` to completion and return its JSON report."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.worker_proc", url, *args],
        cwd=HERE.parent,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"worker process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def empty(app: Any, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.delete(app.tables.jobs))
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f"VACUUM ANALYZE {app.names.jobs}"))


def bare_rows(n: int) -> list[tuple]:
    rows = []
    for i in range(n):
        text = payload_codec.encode({"n": i})
        rows.append(("noop", "default", text, payload_codec.payload_hash(text), 50, 100))
    return rows


def enqueue_single_with_dbqueue(app: Any, engine: sa.Engine, first: int, count: int) -> float:
    """``app.enqueue`` one job per transaction on one connection; returns seconds."""
    started = time.perf_counter()
    with engine.connect() as conn:
        for i in range(first, first + count):
            with conn.begin():
                app.enqueue(conn, "noop", {"n": i})
    return time.perf_counter() - started


def enqueue_single_own_transaction(app: Any, engine: sa.Engine, first: int, count: int) -> float:
    """``app.enqueue(None, …)``: dbqueue's own short transaction on the App's engine (a script
    or a web handler without a transaction of its own); returns seconds."""
    started = time.perf_counter()
    for i in range(first, first + count):
        app.enqueue(None, "noop", {"n": i})
    return time.perf_counter() - started


def enqueue_single_session(app: Any, engine: sa.Engine, first: int, count: int) -> float:
    """``app.enqueue(session, …)`` then ``session.commit()``, one ORM Session per job on the
    benchmark's engine (a web handler's unit of work); returns seconds."""
    started = time.perf_counter()
    for i in range(first, first + count):
        with Session(engine) as session:
            app.enqueue(session, "noop", {"n": i})
            session.commit()
    return time.perf_counter() - started


SINGLE_BLOCK = 200
#: The one-job-per-transaction ways measured, each against the bare INSERT+COMMIT.
SINGLE_WAYS = {
    "single": enqueue_single_with_dbqueue,
    "single_none": enqueue_single_own_transaction,
    "single_session": enqueue_single_session,
}


def _insert_through(conn: Any, sql: str, row: tuple) -> None:
    result = conn.exec_driver_sql(sql, row)
    if result.returns_rows:
        result.fetchone()


def sqlalchemy_connection(engine: sa.Engine, sql: str, part: list[tuple]) -> float:
    """The bare INSERT through SQLAlchemy, one ``conn.begin()`` per row on one Connection: the
    shape of ``app.enqueue(conn, …)`` without dbqueue; returns seconds."""
    started = time.perf_counter()
    with engine.connect() as conn:
        for row in part:
            with conn.begin():
                _insert_through(conn, sql, row)
    return time.perf_counter() - started


def sqlalchemy_engine(engine: sa.Engine, sql: str, part: list[tuple]) -> float:
    """The bare INSERT in ``engine.begin()``, a pooled connection per row: the shape of
    ``app.enqueue(None, …)`` (run on the App's own engine) without dbqueue; returns seconds."""
    started = time.perf_counter()
    for row in part:
        with engine.begin() as conn:
            _insert_through(conn, sql, row)
    return time.perf_counter() - started


def sqlalchemy_session(engine: sa.Engine, sql: str, part: list[tuple]) -> float:
    """The bare INSERT on a new Session's connection, then ``session.commit()``: the shape of
    ``app.enqueue(session, …)`` without dbqueue; returns seconds."""
    started = time.perf_counter()
    for row in part:
        with Session(engine) as session:
            _insert_through(session.connection(), sql, row)
            session.commit()
    return time.perf_counter() - started


def enqueue_single_interleaved(
    url: str, app: Any, engine: sa.Engine, rows: list[tuple], single: int
) -> dict[str, float]:
    """Bare and dbqueue one-per-transaction enqueues (each way of SINGLE_WAYS) in alternating
    blocks of 200 jobs; returns the seconds of each. Each commit waits for the disk, whose speed
    drifts within seconds on a shared machine: alternating keeps all measured under the same
    conditions. The bare blocks run ``single`` jobs in all, and so does each way. So do
    SQLAlchemy's own floors: the bare INSERT through each way's Connection, Engine or Session,
    no dbqueue (what SQLAlchemy itself costs per transaction, beyond the driver)."""
    table = app.names.jobs
    sql = ceiling.INSERT[ceiling._backend(url)].format(t=table)
    floors = {
        "sqlalchemy_connection": (sqlalchemy_connection, engine),
        "sqlalchemy_engine": (sqlalchemy_engine, app.engine),
        "sqlalchemy_session": (sqlalchemy_session, engine),
    }
    seconds = dict.fromkeys(["bare_single", *SINGLE_WAYS, *floors], 0.0)
    bare = ceiling._connect(url)  # one connection throughout, warm like dbqueue's pooled ones
    try:
        for first in range(0, single, SINGLE_BLOCK):
            count = min(SINGLE_BLOCK, single - first)
            part = rows[first : first + count]
            seconds["bare_single"] += ceiling.enqueue_single(url, table, part, bare)
            for name, way in SINGLE_WAYS.items():
                seconds[name] += way(app, engine, first, count)
            for name, (floor, where) in floors.items():
                seconds[name] += floor(where, sql, part)
    finally:
        bare.close()
    return seconds


#: The one-job enqueue ratios, each with SQLAlchemy's floor for the same shape.
SINGLE_FLOORS = {
    "enqueue_single_ratio": "sqlalchemy_connection",
    "enqueue_single_none_ratio": "sqlalchemy_engine",
    "enqueue_single_session_ratio": "sqlalchemy_session",
}


def enqueue_many_with_dbqueue(
    app: Any, engine: sa.Engine, first: int, last: int, chunk: int
) -> float:
    """``app.enqueue_many``, ``chunk`` jobs per call and transaction; returns seconds. The job
    dicts are built first, as the bare INSERT's rows are: the clock times the calls."""
    specs = [{"task": "noop", "payload": {"n": i}} for i in range(first, last)]
    started = time.perf_counter()
    with engine.connect() as conn:
        for start in range(0, len(specs), chunk):
            with conn.begin():
                app.enqueue_many(conn, specs[start : start + chunk])
    return time.perf_counter() - started


def enqueue_many_interleaved(
    url: str, app: Any, engine: sa.Engine, rows: list[tuple], first: int, chunk: int
) -> tuple[float, float]:
    """The bare multi-row INSERT and ``enqueue_many`` of ``rows[first:]``, call by call in
    turn (as the one-per-transaction enqueues alternate): the seconds of each. Both get their
    input ready-made (the bare INSERT its encoded rows, dbqueue the job dicts); each call is one
    transaction of ``chunk`` jobs. Which of the two goes first swaps every call: on SQLite the
    second writer of a pair pays more (its commit took 7-11 µs a job against the first's 4-6,
    whichever it was), so a fixed order measured the order, not the code."""
    bare_seconds = dbqueue_seconds = 0.0
    bare = ceiling._connect(url)
    try:
        for call, start in enumerate(range(first, len(rows), chunk)):
            end = min(len(rows), start + chunk)
            if call % 2:
                dbqueue_seconds += enqueue_many_with_dbqueue(app, engine, start, end, chunk)
            bare_seconds += bulk_insert_bare(url, app.names.jobs, rows[start:end], chunk, bare)
            if not call % 2:
                dbqueue_seconds += enqueue_many_with_dbqueue(app, engine, start, end, chunk)
    finally:
        bare.close()
    return bare_seconds, dbqueue_seconds


def bulk_insert_bare(
    url: str, table: str, rows: list[tuple], chunk: int, conn: Any = None
) -> float:
    """Multi-row INSERT through the driver's own fast path (on ``conn``, kept open by the
    caller, else a new connection); returns seconds."""
    backend = ceiling._backend(url)
    own = conn is None
    if own:
        conn = ceiling._connect(url)
    columns = "(task, queue, payload, payload_hash, priority, max_attempts)"
    try:
        started = time.perf_counter()
        for first in range(0, len(rows), chunk):
            part = rows[first : first + chunk]
            if backend == "postgresql":
                from psycopg2.extras import execute_values

                with conn.cursor() as cur:
                    execute_values(
                        cur,
                        f"INSERT INTO {table} {columns} VALUES %s RETURNING id",
                        part,
                        page_size=chunk,
                        fetch=True,
                    )
                conn.commit()
            elif backend == "mysql":
                with conn.cursor() as cur:
                    cur.executemany(
                        f"INSERT INTO {table} {columns} VALUES (%s,%s,%s,%s,%s,%s)", part
                    )
                conn.commit()
            else:
                conn.execute("BEGIN")
                conn.executemany(f"INSERT INTO {table} {columns} VALUES (?,?,?,?,?,?)", part)
                conn.execute("COMMIT")
        return time.perf_counter() - started
    finally:
        if own:
            conn.close()


def analyze(app: Any, engine: sa.Engine) -> None:
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f"ANALYZE {app.names.jobs}"))


#: The rates a W1 round measures, each a list over the rounds.
RATE_KEYS = (
    "bare_single",
    *SINGLE_WAYS,
    *SINGLE_FLOORS.values(),
    "bulk",
    "bare_bulk",
    "process",
    "bare_process",
)


@dataclasses.dataclass
class W1:
    """One W1 run's fixed parts: the database and its App, the bare rows, the workload's shape."""

    url: str
    app: Any
    engine: sa.Engine
    rows: list[tuple]
    single: int
    chunk: int
    concurrency: int
    batch_size: int
    strategy: str | None

    def worker_options(self) -> list[str]:
        shape = ["--concurrency", str(self.concurrency), "--batch-size", str(self.batch_size)]
        return ["--burst", *shape, *(["--strategy", self.strategy] if self.strategy else [])]

    def bare_drain(self, batch_size: int) -> float:
        """The ceiling's drain of every row, ``batch_size`` a claim: jobs/s."""
        empty(self.app, self.engine)
        bulk_insert_bare(self.url, self.app.names.jobs, self.rows, self.chunk)
        analyze(self.app, self.engine)
        n, seconds = ceiling.drain(self.url, self.app.names.jobs, self.concurrency, batch_size)
        return n / seconds


def run(
    database: str,
    jobs: int,
    single: int,
    chunk: int,
    concurrency: int,
    batch_size: int,
    strategy: str | None,
    rounds: int = 3,
) -> dict[str, Any]:
    """``rounds`` rounds, each measuring dbqueue and then the bare ceiling on the same freshly
    emptied table: a 2-core machine shared with the database drifts by a third within minutes,
    so figures are medians and each ratio compares measurements minutes apart, not a run apart."""
    url = URLS[database]
    app = fresh_app(url)
    engine = app.create_engine(pool_pre_ping=False)
    w1 = W1(url, app, engine, bare_rows(jobs), single, chunk, concurrency, batch_size, strategy)
    rates: dict[str, list[float]] = {k: [] for k in RATE_KEYS}
    try:
        for _ in range(rounds):
            enqueue_round(w1, rates)
            process_round(w1, rates)
        # For reference: the ceiling one job per round trip.
        bare_one = w1.bare_drain(1) if batch_size != 1 else None
    finally:
        engine.dispose()
    return w1_result(database, w1, rates, bare_one, rounds)


def enqueue_round(w1: W1, rates: dict[str, list[float]]) -> None:
    """One round of the enqueue figures: one job per transaction each way, then in bulk."""
    app, engine, jobs, single = w1.app, w1.engine, len(w1.rows), w1.single
    empty(app, engine)
    for name, seconds in enqueue_single_interleaved(w1.url, app, engine, w1.rows, single).items():
        rates[name].append(single / seconds)
    empty(app, engine)
    bare_bulk, bulk = enqueue_many_interleaved(w1.url, app, engine, w1.rows, single, w1.chunk)
    rates["bare_bulk"].append((jobs - single) / bare_bulk)
    rates["bulk"].append((jobs - single) / bulk)


def process_round(w1: W1, rates: dict[str, list[float]]) -> None:
    """One round of processing: a dbqueue worker process drains the table, then the ceiling."""
    app, engine = w1.app, w1.engine
    empty(app, engine)
    app.enqueue_many(engine, [{"task": "noop", "payload": {"n": i}} for i in range(len(w1.rows))])
    analyze(app, engine)
    if w1.strategy == "lock_server":
        with lock_server(w1.url) as server:
            report = run_worker_process(w1.url, "--lock-server", server, *w1.worker_options())
    else:
        report = run_worker_process(w1.url, *w1.worker_options())
    rates["process"].append(report["succeeded"] / report["seconds"])
    rates["bare_process"].append(w1.bare_drain(w1.batch_size))


def w1_result(
    database: str, w1: W1, rates: dict[str, list[float]], bare_one: float | None, rounds: int
) -> dict[str, Any]:
    """The saved result: each figure the median of its rounds, and its ratio to the ceiling."""
    med = {k: statistics.median(v) for k, v in rates.items()}
    bare = {str(w1.batch_size): round(med["bare_process"])}
    if bare_one is not None:
        bare = {"1": round(bare_one), **bare}
    return {
        "workload": "W1 throughput",
        "database": database,
        "server": server_version(w1.url),
        "strategy": w1.strategy or "default",
        "jobs": len(w1.rows),
        "single": w1.single,
        "chunk": w1.chunk,
        "concurrency": w1.concurrency,
        "batch_size": w1.batch_size,
        "rounds": rounds,
        "enqueue_single_jobs_per_s": round(med["single"]),
        "enqueue_single_ceiling_jobs_per_s": round(med["bare_single"]),
        "enqueue_single_ratio": round(med["single"] / med["bare_single"], 2),
        "enqueue_single_none_jobs_per_s": round(med["single_none"]),
        "enqueue_single_none_ratio": round(med["single_none"] / med["bare_single"], 2),
        "enqueue_single_session_jobs_per_s": round(med["single_session"]),
        "enqueue_single_session_ratio": round(med["single_session"] / med["bare_single"], 2),
        "sqlalchemy_floor_ratios": {
            way: round(med[floor] / med["bare_single"], 2) for way, floor in SINGLE_FLOORS.items()
        },
        "enqueue_bulk_jobs_per_s": round(med["bulk"]),
        "enqueue_bulk_ceiling_jobs_per_s": round(med["bare_bulk"]),
        "enqueue_bulk_ratio": round(med["bulk"] / med["bare_bulk"], 2),
        "processed": len(w1.rows),
        "process_jobs_per_s": round(med["process"]),
        "process_ceiling_jobs_per_s": bare,
        "process_ratio": round(med["process"] / med["bare_process"], 2),
        "per_round": {k: [round(x) for x in v] for k, v in rates.items()},
    }


def alternate_modes(
    app: Any,
    engine: Any,
    url: str,
    jobs: int,
    rounds: int,
    options: list[str],
    modes: dict[str, tuple[str, ...]],
) -> dict[str, list[float]]:
    """Each round drains a freshly filled table once per mode (extra worker options), in
    alternating order, so that drift on the machine weighs on every mode alike: jobs/s per mode."""
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    for index in range(rounds):
        for mode in sorted(modes, reverse=index % 2 == 1):
            empty(app, engine)
            app.enqueue_many(engine, [{"task": "noop", "payload": {"n": i}} for i in range(jobs)])
            analyze(app, engine)
            report = run_worker_process(url, *options, *modes[mode])
            assert report["succeeded"] == jobs, report
            rates[mode].append(report["succeeded"] / report["seconds"])
    return rates


def job_log_cost(
    database: str,
    jobs: int,
    concurrency: int,
    batch_size: int,
    rounds: int,
    prefix: str = PREFIX,
) -> dict[str, Any]:
    """W1 processing with the per-job log line off and on (medians of ``rounds`` rounds)."""
    url = URLS[database]
    app = fresh_app(url, prefix)
    engine = app.create_engine(pool_pre_ping=False)
    options = ["--burst", "--concurrency", str(concurrency), "--batch-size", str(batch_size)]
    options += ["--log-format", "json", "--prefix", prefix]
    modes: dict[str, tuple[str, ...]] = {"off": (), "on": ("--log-jobs",)}
    try:
        rates = alternate_modes(app, engine, url, jobs, rounds, options, modes)
    finally:
        engine.dispose()
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    return {
        "workload": "W1 processing, per-job log off and on",
        "database": database,
        "server": server_version(url),
        "jobs": jobs,
        "concurrency": concurrency,
        "batch_size": batch_size,
        "rounds": rounds,
        "log_jobs_off_jobs_per_s": round(off),
        "log_jobs_on_jobs_per_s": round(on),
        "log_jobs_ratio": round(on / off, 3),
        "per_round": {mode: [round(x) for x in values] for mode, values in rates.items()},
    }


def limit_cost(
    database: str,
    jobs: int,
    concurrency: int,
    batch_size: int,
    rounds: int,
    limit: int,
    strategy: str | None,
    prefix: str = PREFIX,
) -> dict[str, Any]:
    """W1 processing of the queue unlimited and limited to ``limit`` (medians of ``rounds``)."""
    url = URLS[database]
    app = fresh_app(url, prefix)
    engine = app.create_engine(pool_pre_ping=False)
    options = ["--burst", "--concurrency", str(concurrency), "--batch-size", str(batch_size)]
    options += ["--prefix", prefix, *(["--strategy", strategy] if strategy else [])]
    modes: dict[str, tuple[str, ...]] = {
        "unlimited": (),
        "limited": ("--queue-limit", f"default={limit}"),
    }
    server = lock_server(url, prefix) if strategy == "lock_server" else contextlib.nullcontext()
    try:
        with server as address:
            if address:
                options += ["--lock-server", address]
            rates = alternate_modes(app, engine, url, jobs, rounds, options, modes)
    finally:
        engine.dispose()
    unlimited, limited = statistics.median(rates["unlimited"]), statistics.median(rates["limited"])
    return {
        "workload": f"W1 processing, queue unlimited and limited to {limit}",
        "database": database,
        "server": server_version(url),
        "strategy": strategy or "default",
        "jobs": jobs,
        "concurrency": concurrency,
        "batch_size": batch_size,
        "limit": limit,
        "rounds": rounds,
        "unlimited_jobs_per_s": round(unlimited),
        "limited_jobs_per_s": round(limited),
        "limited_ratio": round(limited / unlimited, 3),
        "per_round": {mode: [round(x) for x in values] for mode, values in rates.items()},
    }


REGISTRY_MODES: dict[str, tuple[str, ...]] = {
    "heartbeat_hourly": ("--option", "heartbeat_interval=3600.0"),
    "heartbeat_5s": ("--option", "heartbeat_interval=5.0"),
    "heartbeat_0.5s": ("--option", "heartbeat_interval=0.5"),
    "heartbeat_5s_metrics": ("--option", "heartbeat_interval=5.0", "--metrics"),
}


def registry_cost(
    database: str, jobs: int, concurrency: int, batch_size: int, rounds: int, prefix: str = PREFIX
) -> dict[str, Any]:
    """W1 processing with the registry's heartbeat at several rates, and with metrics."""
    url = URLS[database]
    app = fresh_app(url, prefix)
    engine = app.create_engine(pool_pre_ping=False)
    options = ["--burst", "--concurrency", str(concurrency), "--batch-size", str(batch_size)]
    options += ["--prefix", prefix]
    try:
        rates = alternate_modes(app, engine, url, jobs, rounds, options, REGISTRY_MODES)
    finally:
        engine.dispose()
    medians = {mode: round(statistics.median(values)) for mode, values in rates.items()}
    base = medians["heartbeat_hourly"]
    return {
        "workload": "W1 processing, registry heartbeat rates and Prometheus metrics",
        "database": database,
        "server": server_version(url),
        "jobs": jobs,
        "concurrency": concurrency,
        "batch_size": batch_size,
        "rounds": rounds,
        "jobs_per_s": medians,
        "ratio_to_hourly": {mode: round(v / base, 3) for mode, v in medians.items()},
        "per_round": {mode: [round(x) for x in values] for mode, values in rates.items()},
    }


def describe_registry(result: dict[str, Any]) -> str:
    return (
        f"W1 processing with the workers registry and metrics ({result['database']}, "
        f"{result['jobs']} no-op jobs, concurrency {result['concurrency']}, batch "
        f"{result['batch_size']}): jobs/s {result['jobs_per_s']}, ratio to the hourly "
        f"heartbeat {result['ratio_to_hourly']} (medians of {result['rounds']} rounds; per "
        f"round {result['per_round']})"
    )


def describe_limit(result: dict[str, Any]) -> str:
    return (
        f"W1 processing of a queue limited to {result['limit']} ({result['database']}, "
        f"strategy {result['strategy']}, {result['jobs']} no-op jobs, one worker process, "
        f"concurrency {result['concurrency']}, batch {result['batch_size']}): unlimited "
        f"{result['unlimited_jobs_per_s']} jobs/s, limited {result['limited_jobs_per_s']} "
        f"jobs/s, ratio {result['limited_ratio']} (medians of {result['rounds']} rounds; per "
        f"round {result['per_round']})"
    )


def describe_job_log(result: dict[str, Any]) -> str:
    return (
        f"W1 processing with the per-job log ({result['database']}, {result['jobs']} no-op "
        f"jobs, concurrency {result['concurrency']}, batch {result['batch_size']}, JSON lines "
        f"to a pipe): off {result['log_jobs_off_jobs_per_s']} jobs/s, on "
        f"{result['log_jobs_on_jobs_per_s']} jobs/s, ratio {result['log_jobs_ratio']} "
        f"(medians of {result['rounds']} rounds; per round {result['per_round']})"
    )


def describe(result: dict[str, Any]) -> str:
    bare = result["process_ceiling_jobs_per_s"]
    return "\n".join(
        [
            f"W1 {result['database']} ({result['server']}, strategy {result['strategy']}, "
            f"{result['jobs']} no-op jobs, concurrency {result['concurrency']}, "
            f"batch {result['batch_size']})",
            f"  enqueue, one per transaction: {result['enqueue_single_jobs_per_s']:>8} jobs/s  "
            f"(bare INSERT+COMMIT {result['enqueue_single_ceiling_jobs_per_s']}, "
            f"ratio {result['enqueue_single_ratio']})",
            f"    enqueue(None, …):           {result['enqueue_single_none_jobs_per_s']:>8} "
            f"jobs/s  (ratio {result['enqueue_single_none_ratio']})",
            f"    enqueue(session) + commit:  {result['enqueue_single_session_jobs_per_s']:>8} "
            f"jobs/s  (ratio {result['enqueue_single_session_ratio']})",
            "    SQLAlchemy alone, the bare INSERT in the same three shapes (ratios): "
            + ", ".join(f"{v}" for v in result["sqlalchemy_floor_ratios"].values()),
            f"  enqueue_many:                 {result['enqueue_bulk_jobs_per_s']:>8} jobs/s  "
            f"(bare multi-row INSERT {result['enqueue_bulk_ceiling_jobs_per_s']}, "
            f"ratio {result['enqueue_bulk_ratio']})",
            f"  processing:                   {result['process_jobs_per_s']:>8} jobs/s  "
            f"(bare claim+complete: {', '.join(f'batch {k}: {v}' for k, v in bare.items())}; "
            f"ratio {result['process_ratio']})",
            f"  medians of {result['rounds']} rounds; per round: "
            + "; ".join(f"{k} {v}" for k, v in result["per_round"].items()),
        ]
    )


def print_cost(args: argparse.Namespace) -> None:
    """``--registry``, ``--queue-limit`` or ``--job-log``: that feature's cost instead of W1."""
    if args.registry:
        cost = registry_cost(
            args.database, args.jobs, args.concurrency, args.batch_size, args.rounds, args.prefix
        )
        print(machine())
        print(describe_registry(cost))
        print(f"saved {save(f'registry-{args.database}', cost)}")
        return
    if args.queue_limit:
        cost = limit_cost(
            args.database,
            args.jobs,
            args.concurrency,
            args.batch_size,
            args.rounds,
            args.queue_limit,
            args.strategy,
            args.prefix,
        )
        print(machine())
        print(describe_limit(cost))
        suffix = f"-{args.strategy}" if args.strategy else ""
        print(f"saved {save(f'queue-limit-{args.database}{suffix}', cost)}")
        return
    if args.job_log:
        cost = job_log_cost(
            args.database, args.jobs, args.concurrency, args.batch_size, args.rounds, args.prefix
        )
        print(machine())
        print(describe_job_log(cost))
        print(f"saved {save(f'joblog-{args.database}', cost)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--single", type=int, default=2_000)
    parser.add_argument("--chunk", type=int, default=1_000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--strategy")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--job-log", action="store_true", help="the per-job log's cost instead")
    parser.add_argument("--prefix", default=PREFIX, help="table prefix (--job-log, --queue-limit)")
    parser.add_argument("--queue-limit", type=int, help="a queue limited to N instead")
    parser.add_argument("--registry", action="store_true", help="the registry's cost instead")
    args = parser.parse_args()
    os.chdir(HERE.parent)
    if args.registry or args.queue_limit or args.job_log:
        print_cost(args)
        return
    result = run(
        args.database,
        args.jobs,
        args.single,
        args.chunk,
        args.concurrency,
        args.batch_size,
        args.strategy,
        args.rounds,
    )
    print(machine())
    print(describe(result))
    suffix = f"-{args.strategy}" if args.strategy else ""
    print(f"saved {save(f'throughput-{args.database}{suffix}', result)}")


if __name__ == "__main__":
    main()

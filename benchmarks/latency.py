"""W2 — wake-up latency: enqueue commit → handler start, on an idle worker.

    python -m benchmarks.latency postgresql|mariadb|sqlite [--jobs 200] [--gap 0.02]

A worker process (concurrency 1) waits idle; this process enqueues jobs one at a time, one
transaction each, ``gap`` seconds apart, and notes the time each commit returned. The handler
notes the time it started, in a table, in its own transaction. Both clocks are this machine's.
PostgreSQL wakes the worker with the insert trigger's NOTIFY; MariaDB and SQLite poll (adaptive:
50 ms after work, doubling to 1 s).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa

import dbqueue
from benchmarks.common import (
    PREFIX,
    URLS,
    fresh_app,
    lock_server,
    machine,
    save,
    server_version,
    summary_ms,
)

HERE = Path(__file__).resolve().parent
timings = sa.MetaData()
starts = sa.Table(
    "bench_starts",
    timings,
    sa.Column("job_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("started", sa.Float(precision=53), nullable=False),
)


def worker_main(url: str, strategy: str | None, server: str | None = None) -> None:
    """Runs in the worker process."""
    import dbqueue

    app = dbqueue.App(url, table_prefix="bench_", lock_server=server)

    @app.task("ping")
    def ping(job, session):
        session.execute(starts.insert().values(job_id=job.id, started=time.time()))

    app.run_worker(strategy=strategy, maintenance=False)


def run(database: str, jobs: int, gap: float, strategy: str | None) -> dict:
    if strategy != "lock_server":
        return _run(database, jobs, gap, strategy, None)
    fresh_app(URLS[database])
    with lock_server(URLS[database]) as server:
        return _run(database, jobs, gap, strategy, server)


def _run(database: str, jobs: int, gap: float, strategy: str | None, server: str | None) -> dict:
    url = URLS[database]
    if server is None:
        app = fresh_app(url)
    else:  # tables made fresh before the server started; enqueues hint it
        app = dbqueue.App(url, table_prefix=PREFIX, lock_server=server)
    engine = app.create_engine()
    timings.drop_all(engine)
    timings.create_all(engine)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from benchmarks.latency import worker_main; "
            f"worker_main({url!r}, {strategy!r}, {server!r})",
        ],
        cwd=HERE.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    committed: dict[int, float] = {}
    try:
        time.sleep(3)  # started, migrated check done, idle
        for _ in range(jobs):
            with engine.begin() as conn:
                job_id = app.enqueue(conn, "ping", {})
            committed[job_id] = time.time()
            time.sleep(gap)
        deadline = time.time() + 60
        while time.time() < deadline:
            with engine.connect() as conn:
                done = conn.execute(sa.select(sa.func.count()).select_from(starts)).scalar()
            if done >= jobs:
                break
            time.sleep(0.2)
        with engine.connect() as conn:
            started = dict(conn.execute(sa.select(starts.c.job_id, starts.c.started)).all())
    finally:
        worker.terminate()
        worker.wait(30)
        engine.dispose()
    latencies = [started[i] - committed[i] for i in committed if i in started]
    return {
        "workload": "W2 wake-up latency",
        "database": database,
        "server": server_version(url),
        "strategy": strategy or "default",
        "wake_up": _wake_up(database, strategy),
        "jobs": jobs,
        "gap_ms": gap * 1000,
        "picked_up": len(latencies),
        "latency_ms": summary_ms(latencies),
    }


def _wake_up(database: str, strategy: str | None) -> str:
    if strategy == "lock_server":
        return "lock-server push (enqueue hint)"
    if database == "sqlite":
        return "commit watch (data_version), adaptive polling"
    return "LISTEN/NOTIFY" if database == "postgresql" else "adaptive polling"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.02)
    parser.add_argument("--strategy")
    args = parser.parse_args()
    os.chdir(HERE.parent)
    result = run(args.database, args.jobs, args.gap, args.strategy)
    lat = result["latency_ms"]
    print(f"{machine()}")
    print(
        f"W2 {result['database']} ({result['server']}, {result['wake_up']}, strategy "
        f"{result['strategy']}): {result['picked_up']}/{result['jobs']} jobs, "
        f"enqueue commit → handler start p50 {lat['p50']} ms, p95 {lat['p95']} ms, "
        f"p99 {lat['p99']} ms (max {lat['max']} ms)"
    )
    suffix = f"-{args.strategy}" if args.strategy else ""
    print(f"saved {save(f'latency-{args.database}{suffix}', result)}")


if __name__ == "__main__":
    main()

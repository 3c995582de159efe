"""W3 — load on the database: what processing a job, and an idle worker, cost the server.

    python -m benchmarks.load postgresql|mariadb|sqlite [--jobs 20000] [--idle-seconds 30]

Processing: 20,000 no-op jobs drained by one worker process (concurrency 4, batch 10); per job,
the statements and commits the worker sent (counted by SQLAlchemy events in the worker), and the
server's own counters (PostgreSQL ``pg_stat_database``: transactions and rows touched; MariaDB
``SHOW GLOBAL STATUS``: Questions, commits) as deltas over the run.
Idle: a worker with its defaults (concurrency 4, maintenance on) on an empty queue; statements
and commits it sends per minute, counted over ``idle-seconds`` after a 5 s warm-up.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from benchmarks.common import URLS, fresh_app, machine, save, server_version
from benchmarks.throughput import run_worker_process

HERE = Path(__file__).resolve().parent
MYSQL_STATUS = (
    "Questions",
    "Com_commit",
    "Handler_commit",
    "Com_select",
    "Com_update",
    "Com_insert",
    "Com_delete",
)


def server_counters(url: str) -> dict[str, int]:
    """The server's cumulative counters for this database (empty for SQLite)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            backend = conn.dialect.name
            if backend == "postgresql":
                row = conn.execute(
                    sa.text(
                        "SELECT xact_commit, xact_rollback, tup_returned, tup_fetched, "
                        "tup_inserted, tup_updated, tup_deleted FROM pg_stat_database "
                        "WHERE datname = current_database()"
                    )
                ).one()
                return {key: int(value) for key, value in row._mapping.items()}
            if backend in ("mysql", "mariadb"):
                rows = conn.execute(sa.text("SHOW GLOBAL STATUS")).all()
                return {name: int(value) for name, value in rows if name in MYSQL_STATUS}
            return {}
    finally:
        engine.dispose()


def processing(url: str, jobs: int) -> dict[str, Any]:
    app = fresh_app(url)
    app.enqueue_many(None, [{"task": "noop", "payload": {"n": i}} for i in range(jobs)])
    time.sleep(1.5)  # let the enqueue's statistics reach the server's counters
    before = server_counters(url)
    report = run_worker_process(url, "--burst", "--count")
    time.sleep(1.5)  # the worker's backends flush their statistics when they exit
    after = server_counters(url)
    done = max(1, report["succeeded"])
    per_job = {key: round((after[key] - before[key]) / done, 3) for key in after}
    return {
        "processed": report["succeeded"],
        "statements_per_job": round(report["statements"] / done, 3),
        "commits_per_job": round(report["commits"] / done, 3),
        "server_per_job": per_job,
    }


def idle(url: str, seconds: float) -> dict[str, Any]:
    fresh_app(url)
    report = run_worker_process(url, "--idle-window", f"5,{seconds}")
    window = report["window"]
    scale = 60.0 / window["seconds"]
    return {
        "statements_per_minute": round(window["statements"] * scale, 1),
        "commits_per_minute": round(window["commits"] * scale, 1),
    }


def run(database: str, jobs: int, idle_seconds: float) -> dict[str, Any]:
    url = URLS[database]
    return {
        "workload": "W3 load on the database",
        "database": database,
        "server": server_version(url),
        "jobs": jobs,
        "processing": processing(url, jobs),
        "idle_worker": idle(url, idle_seconds),
    }


def describe(result: dict[str, Any]) -> str:
    p, i = result["processing"], result["idle_worker"]
    server = ", ".join(f"{k} {v}" for k, v in p["server_per_job"].items()) or "no server counters"
    return "\n".join(
        [
            f"W3 {result['database']} ({result['server']})",
            f"  per processed job: {p['statements_per_job']} statements, "
            f"{p['commits_per_job']} commits (worker side); server: {server}",
            f"  idle worker (concurrency 4, maintenance on): {i['statements_per_minute']} "
            f"statements and {i['commits_per_minute']} commits per minute",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    args = parser.parse_args()
    os.chdir(HERE.parent)
    result = run(args.database, args.jobs, args.idle_seconds)
    print(machine())
    print(describe(result))
    print(f"saved {save(f'load-{args.database}', result)}")


if __name__ == "__main__":
    main()

"""Idle fleet: what 50 idle worker processes cost the database.

    python -m benchmarks.idle_fleet postgresql|mariadb|sqlite [--workers 50] [--seconds 60]

``workers`` worker processes with their defaults (concurrency 4, maintenance on) on an empty
queue are set up, released together (``benchmarks.fleet``) and left idle; after a 5 s warm-up,
over ``seconds``: the connections the server holds for this database (PostgreSQL
``pg_stat_activity``, MariaDB ``information_schema.PROCESSLIST`` filtered by database; sampled
at the window's middle), the server's own counters (PostgreSQL transactions of this database,
``xact_commit + xact_rollback``, as it counts no statements without pg_stat_statements; MariaDB
``Questions``, server-wide: other clients are counted too) and the statements and commits each
worker sent (counted in the worker by SQLAlchemy events), per minute, in total and per worker.

A worker's pool keeps ``concurrency + 2`` connections (a slot's each, the listener, the
heartbeat): 50 workers need 300, over PostgreSQL's default ``max_connections`` of 100. When the
server would refuse them, the fleet is cut to what fits (leaving a margin for other clients)
and the result says so, with the connections the full fleet would need.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import URLS, fresh_app, machine, save, server_version
from benchmarks.fleet import fleet, free_connections, server_connections
from benchmarks.load import server_counters

HERE = Path(__file__).resolve().parent
WARMUP = 5.0
CONNECTIONS_PER_WORKER = 4 + 2  # concurrency 4: dbqueue.worker.runner's pool_size
MARGIN = 10  # connections left to other clients of a shared server
SERVER_STATEMENTS = {"xact_commit": "transactions", "xact_rollback": "transactions",
                     "Questions": "questions"}  # fmt: skip


def server_rates(before: dict[str, int], after: dict[str, int], seconds: float) -> dict:
    """Per minute, the server's statement-like counters over the window."""
    found: dict[str, float] = {}
    for key, name in SERVER_STATEMENTS.items():
        if key in after:
            found[name] = found.get(name, 0) + (after[key] - before[key]) * 60 / seconds
    return {f"{name}_per_minute": round(value) for name, value in found.items()}


def fitting(url: str, wanted: int) -> int:
    """As many of ``wanted`` workers as the server's connection limit lets in."""
    free = free_connections(url)
    if free is None:
        return wanted
    return max(1, min(wanted, (free - MARGIN) // CONNECTIONS_PER_WORKER))


def run(database: str, wanted: int, seconds: float) -> dict[str, Any]:
    url = URLS[database]
    fresh_app(url)
    workers = fitting(url, wanted)
    options = ["--idle-window", f"{WARMUP},{seconds}"]
    with fleet(url, workers, options) as idle:
        ready = idle.wait_ready()
        moment = idle.go()
        time.sleep(WARMUP)
        before, started = server_counters(url), time.monotonic()
        time.sleep(seconds / 2)
        connections = server_connections(url)
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        after = server_counters(url)
        window = time.monotonic() - started
        reports = idle.reports()
    statements = [r["window"]["statements"] * 60 / r["window"]["seconds"] for r in reports]
    commits = [r["window"]["commits"] * 60 / r["window"]["seconds"] for r in reports]
    server = server_rates(before, after, window)
    return {
        "workload": "idle fleet: idle worker processes (concurrency 4, maintenance on)",
        "database": database,
        "server": server_version(url),
        "workers": workers,
        "workers_wanted": wanted,
        "cut_by_max_connections": workers < wanted,
        "seconds": seconds,
        "setup_seconds": round(ready, 1),
        "latest_start_s": round(max(r["started_at"] for r in reports) - moment, 3),
        "server_connections": connections,
        "connections_per_worker": round(connections / workers, 2) if connections else None,
        "connections_for_wanted": round(connections / workers * wanted) if connections else None,
        **server,
        "server_per_worker_per_minute": {k: round(v / workers, 1) for k, v in server.items()},
        "client_statements_per_minute": round(sum(statements)),
        "client_commits_per_minute": round(sum(commits)),
        "per_worker_statements_per_minute": {
            "median": round(statistics.median(statements), 1),
            "min": round(min(statements), 1),
            "max": round(max(statements), 1),
        },
        "per_worker_commits_per_minute": round(statistics.median(commits), 1),
        "worker_rss_kib_median": round(statistics.median(r["rss_end_kib"] for r in reports)),
    }


def describe(result: dict[str, Any]) -> str:
    per = result["per_worker_statements_per_minute"]
    names = ("transactions_per_minute", "questions_per_minute")
    server = ", ".join(f"{k} {result[k]:,}" for k in names if k in result)
    return "\n".join(
        [
            f"Idle fleet {result['database']} ({result['server']}): {result['workers']} idle "
            f"worker processes (concurrency 4, maintenance on), {result['seconds']:.0f} s "
            f"(set-up took {result['setup_seconds']} s)"
            + (
                f"; cut from {result['workers_wanted']} by the server's max_connections: the "
                f"full fleet would hold {result['connections_for_wanted']} connections"
                if result["cut_by_max_connections"]
                else ""
            ),
            f"  server: {result['server_connections']} connections held "
            f"({result['connections_per_worker']} per worker); {server} (per worker: "
            f"{result['server_per_worker_per_minute']})"
            if server
            else "  no server (SQLite): what the workers sent is the only figure",
            f"  workers sent {result['client_statements_per_minute']:,} statements/min and "
            f"{result['client_commits_per_minute']:,} commits/min; per worker: statements/min "
            f"median {per['median']} (min {per['min']}, max {per['max']}), commits/min "
            f"{result['per_worker_commits_per_minute']}",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    os.chdir(HERE.parent)
    result = run(args.database, args.workers, args.seconds)
    print(machine())
    print(describe(result))
    print(f"saved {save(f'idle-fleet-{args.database}', result)}")


if __name__ == "__main__":
    main()

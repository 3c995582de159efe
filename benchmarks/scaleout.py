"""Scale-out: 1, 2, 4 and 8 worker processes draining the same 100,000 jobs.

    python -m benchmarks.scaleout postgresql|mariadb|sqlite [--jobs 100000] [--processes 1,2,4,8]

For each fleet size the table is refilled with ``jobs`` no-op jobs (``enqueue_many``), the
processes (each ``concurrency=4``, ``batch_size=10``, ``--burst``) are set up, released together
(``benchmarks.fleet``) and drain it; jobs/s is every job over the time from the release to the
last process's exit. Beside it, the commits the database made per second over the same window:
PostgreSQL ``pg_stat_database.xact_commit`` (this database only), MariaDB ``Com_commit`` and
``Handler_commit`` (server-wide: other clients of the server are counted too), and on every
database the commits the workers sent, counted at the client by SQLAlchemy events (SQLite has
no server: that is its only figure). And per job: the claims' size, the statements sent, the
workers' CPU, and the rest of the machine's (the server's, on a machine running nothing else).
Beside each fleet, the same number of processes running the ceiling's bare SQL
(``benchmarks.bare_proc``: 4 threads each, batch 10, through the raw driver), on the same table
refilled: the curve the database and the machine alone allow. The two alternate which drains
first from one fleet size to the next.
Target (issue 19): no collapse, 8 processes ≥ 1 process.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.common import URLS, fresh_app, machine, save, server_threads, server_version
from benchmarks.fleet import fleet
from benchmarks.load import server_counters
from benchmarks.throughput import analyze, empty

HERE = Path(__file__).resolve().parent
COMMIT_COUNTERS = ("xact_commit", "Com_commit", "Handler_commit")


def drain(url: str, size: int, table: str | None = None) -> dict[str, Any]:
    """Release ``size`` processes on the filled table; their jobs/s and the commits/s. With
    ``table``, the processes are the ceiling's bare drain on it instead of dbqueue workers."""
    shape = ["--concurrency", "4", "--batch-size", "10"]
    options, module = (
        (["--burst", "--count", *shape], "benchmarks.worker_proc")
        if table is None
        else (["--table", table, *shape], "benchmarks.bare_proc")
    )
    with fleet(url, size, options, module=module) as workers:
        ready = workers.wait_ready()
        before = server_counters(url)
        busy_before = machine_busy_seconds()
        moment = workers.go()
        reports = workers.reports()
        busy_after = machine_busy_seconds()
        end = max(r["ended_at"] for r in reports)
        time.sleep(1.0)  # PostgreSQL backends report their statistics at exit
        after = server_counters(url)
    seconds = end - moment
    worker_cpu = sum(r.get("cpu_seconds", 0.0) for r in reports)
    done = sum(r["succeeded"] for r in reports)
    server = {
        f"{key}_per_s": round((after[key] - before[key]) / seconds)
        for key in COMMIT_COUNTERS
        if key in after
    }
    return {
        "processes": size,
        "processed": done,
        "seconds": round(seconds, 2),
        "jobs_per_s": round(done / seconds),
        "client_commits_per_s": round(sum(r["commits"] for r in reports) / seconds),
        # Where the time goes as the fleet grows: a claim's size (rounds: claims, each thread's
        # last one empty in --burst), what the workers send per job, and their own CPU per job
        # (what is left of two cores goes to the database server).
        "jobs_per_claim": round(done / max(1, sum(r.get("rounds", 0) for r in reports)), 2),
        **(
            {"statements_per_job": round(sum(r["statements"] for r in reports) / max(1, done), 3)}
            if table is None
            else {}
        ),
        "worker_cpu_us_per_job": round(1e6 * worker_cpu / max(1, done)),
        # The machine's CPU over the drain beyond the workers' own: the database server's
        # (and on SQLite, which has none, the processes' exits and the machine's other work).
        **(
            {"other_cpu_us_per_job": round(1e6 * (busy_after - busy_before - worker_cpu) / done)}
            if busy_before is not None and busy_after is not None and done
            else {}
        ),
        **server,
        "per_process_jobs": [r["succeeded"] for r in reports],
        "setup_seconds": round(ready, 1),
        "latest_start_s": round(max(r["started_at"] for r in reports) - moment, 3),
    }


def machine_busy_seconds() -> float | None:
    """CPU seconds every core of the machine has spent busy since boot (Linux's /proc/stat:
    all but idle and I/O wait), or None elsewhere."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    ticks = [int(value) for value in fields]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def run(database: str, jobs: int, sizes: list[int]) -> dict[str, Any]:
    url = URLS[database]
    app = fresh_app(url)
    engine = app.create_engine(pool_pre_ping=False)
    curve, bare_curve = [], []
    try:
        for turn, size in enumerate(sizes):
            # dbqueue's fleet and the bare one alternate which drains first, size by size.
            for bare in (turn % 2 == 1, turn % 2 == 0):
                fill(app, engine, jobs)
                point = drain(url, size, app.names.jobs if bare else None)
                assert point["processed"] == jobs, point
                print(f"  {size} processes{', bare SQL' if bare else ''}: "
                      f"{point['jobs_per_s']:,} jobs/s", flush=True)  # fmt: skip
                (bare_curve if bare else curve).append(point)
        empty(app, engine)
    finally:
        engine.dispose()
    by_size = {p["processes"]: p["jobs_per_s"] for p in curve}
    bare_by_size = {p["processes"]: p["jobs_per_s"] for p in bare_curve}
    for point in curve:
        point["ratio_to_bare"] = round(point["jobs_per_s"] / bare_by_size[point["processes"]], 2)
    return {
        "workload": "scale-out: worker processes draining one table",
        "database": database,
        "server": server_version(url),
        **({"thread_handling": threads} if (threads := server_threads(url)) else {}),
        "jobs": jobs,
        "concurrency": 4,
        "batch_size": 10,
        "curve": curve,
        "ratio_max_to_1": round(by_size[max(by_size)] / by_size[min(by_size)], 2),
        # The same fleets running the ceiling's bare SQL: how far the database and the two
        # cores alone let a fleet grow.
        "bare_curve": bare_curve,
        "bare_ratio_max_to_1": round(
            bare_by_size[max(bare_by_size)] / bare_by_size[min(bare_by_size)], 2
        ),
    }


def fill(app: Any, engine: Any, jobs: int) -> None:
    """An empty table refilled with ``jobs`` no-op jobs, then analysed."""
    empty(app, engine)
    for first in range(0, jobs, 1_000):
        batch = [{"task": "noop", "payload": {"n": i}} for i in range(first, first + 1_000)]
        app.enqueue_many(engine, batch[: jobs - first])
    analyze(app, engine)


def describe(result: dict[str, Any]) -> str:
    lines = [
        f"Scale-out {result['database']} ({result['server']}, {result['jobs']:,} no-op jobs, each "
        f"process concurrency {result['concurrency']}, batch {result['batch_size']}"
        + (f"; server thread_handling {result['thread_handling']}" if "thread_handling" in result
           else "")
        + "):"
    ]  # fmt: skip
    for p in result["curve"]:
        server = ", ".join(f"{k} {p[k]:,}" for k in p if k.endswith("_per_s") and k != "jobs_per_s")
        lines.append(
            f"  {p['processes']} processes: {p['jobs_per_s']:>7,} jobs/s; commits/s: {server}; "
            f"jobs per process {p['per_process_jobs']}"
        )
        lines.append(
            f"    jobs per claim {p.get('jobs_per_claim')}, statements per job "
            f"{p.get('statements_per_job')}, worker CPU {p.get('worker_cpu_us_per_job')} µs/job"
            + (f", the rest of the machine's {p['other_cpu_us_per_job']} µs/job"
               if "other_cpu_us_per_job" in p else "")
        )  # fmt: skip
    lines.append(f"  largest fleet / one process: {result['ratio_max_to_1']}")
    if "bare_curve" in result:
        lines.append("  the same fleets running bare SQL (benchmarks.ceiling's drain):")
        for p, ours in zip(result["bare_curve"], result["curve"], strict=True):
            lines.append(
                f"  {p['processes']} processes: {p['jobs_per_s']:>7,} jobs/s (dbqueue / bare "
                f"{ours['ratio_to_bare']}); worker CPU {p['worker_cpu_us_per_job']} µs/job"
                + (f", the rest of the machine's {p['other_cpu_us_per_job']} µs/job"
                   if "other_cpu_us_per_job" in p else "")
            )  # fmt: skip
        lines.append(f"  bare largest fleet / one process: {result['bare_ratio_max_to_1']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--processes", default="1,2,4,8")
    args = parser.parse_args()
    os.chdir(HERE.parent)
    result = run(args.database, args.jobs, [int(n) for n in args.processes.split(",")])
    print(machine())
    print(describe(result))
    print(f"saved {save(f'scaleout-{args.database}', result)}")


if __name__ == "__main__":
    main()

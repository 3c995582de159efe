"""Memory — a worker's resident memory over 100,000 jobs.

    python -m benchmarks.memory postgresql|mariadb|sqlite [--jobs 100000]

One worker process (concurrency 4, batch 10) drains ``jobs`` no-op jobs; its handler samples
VmRSS every 10,000 jobs. Printed: RSS at start-up, after the first 10,000 jobs (warm: imports,
compiled statements, pools), at the last sample (the last 10,000th job, the worker still
running) and once the worker has stopped; flat means the last sample ≈ the first. Growth is
measured between the two samples: after the worker stops, its connections are closed and their
caches freed, which hid growth while it ran (SQLite: -1.8 MiB after the stop, +4.7 MiB while
running, in the run that found it).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from benchmarks.common import URLS, fresh_app, machine, save, server_version
from benchmarks.throughput import run_worker_process

HERE = Path(__file__).resolve().parent
CHUNK = 5_000


def run(database: str, jobs: int) -> dict[str, Any]:
    url = URLS[database]
    app = fresh_app(url)
    engine = app.create_engine()
    try:
        for first in range(0, jobs, CHUNK):
            batch = range(first, min(jobs, first + CHUNK))
            with engine.begin() as conn:
                app.enqueue_many(conn, [{"task": "noop", "payload": {"n": i}} for i in batch])
    finally:
        engine.dispose()
    every = max(1, jobs // 10)
    report = run_worker_process(url, "--burst", "--sample-rss-every", str(every))
    samples = report["rss_samples"]
    warm = samples[0][1] if samples else report["rss_start_kib"]
    last = samples[-1][1] if samples else report["rss_end_kib"]
    return {
        "workload": "memory",
        "database": database,
        "server": server_version(url),
        "jobs": report["succeeded"],
        "rss_start_kib": report["rss_start_kib"],
        "rss_warm_kib": warm,
        "rss_last_kib": last,
        "rss_end_kib": report["rss_end_kib"],
        "growth_after_warm_kib": last - warm,
        "samples": samples,
    }


def describe(result: dict[str, Any]) -> str:
    mib = 1024
    return (
        f"memory {result['database']}: {result['jobs']} jobs; worker RSS "
        f"{result['rss_start_kib'] / mib:.1f} MiB at start, "
        f"{result['rss_warm_kib'] / mib:.1f} MiB after the first tenth, "
        f"{result['rss_last_kib'] / mib:.1f} MiB at the last job "
        f"({result['growth_after_warm_kib']:+d} KiB after warm-up), "
        f"{result['rss_end_kib'] / mib:.1f} MiB once stopped"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--jobs", type=int, default=100_000)
    args = parser.parse_args()
    os.chdir(HERE.parent)
    result = run(args.database, args.jobs)
    print(machine())
    print(describe(result))
    print(f"saved {save(f'memory-{args.database}', result)}")


if __name__ == "__main__":
    main()

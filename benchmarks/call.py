"""``app.call`` round trip: enqueue, a worker runs the job, the caller has the result.

    python -m benchmarks.call postgresql|mariadb|sqlite [--calls 200] [--gap 0.02]
                              [--strategy NAME] [--no-w2]

A worker process (concurrency 1) waits idle; this process makes ``calls`` calls one after the
other, ``gap`` seconds apart, each ``app.call("echo", {...})`` — a transaction of its own for
the enqueue, then the wait for the result — and times each from the call to its return. The
worker is woken as W2's is (NOTIFY on PostgreSQL, polling on MariaDB, a watch of the
database's commits on SQLite, the lock server's push with ``--strategy lock_server``); the
caller is woken by the job's announced end (NOTIFY, the lock server), or polls (5 ms growing to
200 ms), on SQLite beside a watch of the commits that reads at once after each. W2, the
wake-up latency alone, runs next to it with the same number of jobs unless ``--no-w2``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import dbqueue
from benchmarks import latency
from benchmarks.common import (
    URLS,
    fresh_app,
    lock_server,
    machine,
    save,
    server_version,
    summary_ms,
)

HERE = Path(__file__).resolve().parent
PREFIX = "bench_call_"


def worker_main(url: str, strategy: str | None, server: str | None = None) -> None:
    """Runs in the worker process."""
    import dbqueue

    app = dbqueue.App(url, table_prefix=PREFIX, lock_server=server)

    @app.task("echo")
    def echo(job, session):
        return {"id": job.id, "echo": job.payload}

    app.run_worker(strategy=strategy, maintenance=False)


def run(database: str, calls: int, gap: float, strategy: str | None) -> dict:
    url = URLS[database]
    fresh_app(url, PREFIX)
    if strategy != "lock_server":
        return _run(database, calls, gap, strategy, None)
    with lock_server(url, PREFIX) as server:
        return _run(database, calls, gap, strategy, server)


def _run(database: str, calls: int, gap: float, strategy: str | None, server: str | None) -> dict:
    url = URLS[database]
    app = dbqueue.App(url, table_prefix=PREFIX, lock_server=server)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from benchmarks.call import worker_main; worker_main({url!r}, {strategy!r}, "
            f"{server!r})",
        ],
        cwd=HERE.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    times: list[float] = []
    try:
        app.call("echo", {"warm": True}, timeout=60)  # the worker is up, the listener too
        time.sleep(1)
        for n in range(calls):
            started = time.perf_counter()
            answer = app.call("echo", {"n": n}, timeout=30)
            times.append(time.perf_counter() - started)
            assert answer["echo"] == {"n": n}, answer
            time.sleep(gap)
    finally:
        worker.terminate()
        worker.wait(30)
        app.engine.dispose()
    return {
        "workload": "app.call round trip",
        "database": database,
        "server": server_version(url),
        "strategy": strategy or "default",
        "wake_up": _wake_up(database, strategy),
        "calls": calls,
        "gap_ms": gap * 1000,
        "round_trip_ms": summary_ms(times),
    }


def _wake_up(database: str, strategy: str | None) -> str:
    if strategy == "lock_server":
        return "lock-server push both ways"
    if database == "postgresql":
        return "LISTEN/NOTIFY both ways"
    if database == "sqlite":
        return "commit watch both ways, polls beside it"
    return "polling both ways"


def describe(result: dict, w2: dict | None) -> str:
    rt = result["round_trip_ms"]
    line = (
        f"app.call {result['database']} ({result['server']}, {result['wake_up']}, strategy "
        f"{result['strategy']}): {result['calls']} calls, round trip p50 {rt['p50']} ms, "
        f"p95 {rt['p95']} ms, p99 {rt['p99']} ms (max {rt['max']} ms)"
    )
    if w2 is not None:
        lat = w2["latency_ms"]
        line += f"; W2 wake-up alone p50 {lat['p50']} ms, p95 {lat['p95']} ms, p99 {lat['p99']} ms"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.02)
    parser.add_argument("--strategy")
    parser.add_argument("--no-w2", action="store_true", help="Do not run W2 next to it.")
    args = parser.parse_args()
    os.chdir(HERE.parent)
    result = run(args.database, args.calls, args.gap, args.strategy)
    w2 = None if args.no_w2 else latency.run(args.database, args.calls, args.gap, args.strategy)
    if w2 is not None:
        result["w2_latency_ms"] = w2["latency_ms"]
    print(machine())
    print(describe(result, w2))
    suffix = f"-{args.strategy}" if args.strategy else ""
    print(f"saved {save(f'call-{args.database}{suffix}', result)}")


if __name__ == "__main__":
    main()

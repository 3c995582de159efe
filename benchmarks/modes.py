"""Both execution modes side by side: processing, and what one long job costs everybody else.

    python -m benchmarks.modes postgresql|mariadb|sqlite [--jobs 5000] [--rounds 3]
        [--strategy NAME] [--probes 20] [--busy-timeout 2]

Processing: each round fills the table with ``jobs`` no-op jobs and drains it with one worker
process (``benchmarks.worker_proc``, 4 threads, batches of 10) in each mode, in alternating
order: inside the claim's transaction (the default: one transaction per batch) and outside it,
under a lease (``DBQUEUE_TRANSACTION=false``: a claim transaction per batch, then an outcome
transaction per job). The figures are the medians, in jobs per second.

A long job's cost: a worker thread runs one job that lasts until the probes are done, in each
mode; meanwhile ``probes`` enqueues are made one by one from another connection, each timed
(SQLite's connections wait ``busy_timeout`` seconds for the write lock, then fail). Inside the
claim's transaction the job holds its transaction open (on SQLite, the only write lock);
outside it, nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from typing import Any

import sqlalchemy as sa

from benchmarks.common import PREFIX, URLS, fresh_app, machine, save
from benchmarks.throughput import run_worker_process

MODES = {"in_transaction": "true", "leased": "false"}


def fill(app: Any, jobs: int) -> None:
    for first in range(0, jobs, 1000):
        last = min(jobs, first + 1000)
        rows = [{"task": "noop", "payload": {"n": n}} for n in range(first, last)]
        app.enqueue_many(None, rows)


def processing(url: str, jobs: int, rounds: int, strategy: str | None) -> dict[str, float]:
    """Median jobs per second of each mode, rounds alternating which goes first."""
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    extra = ["--strategy", strategy] if strategy else []
    for index in range(rounds):
        order = list(MODES) if index % 2 == 0 else list(reversed(MODES))
        for mode in order:
            app = fresh_app(url)
            fill(app, jobs)
            os.environ["DBQUEUE_TRANSACTION"] = MODES[mode]
            try:
                report = run_worker_process(url, "--burst", "--prefix", PREFIX, *extra)
            finally:
                del os.environ["DBQUEUE_TRANSACTION"]
            rates[mode].append(report["succeeded"] / report["seconds"])
    return {mode: statistics.median(values) for mode, values in rates.items()}


def long_job_cost(url: str, mode: str, probes: int, busy_timeout: float) -> dict[str, Any]:
    """Enqueue times (ms) and failures while one job of ``mode`` runs."""
    app = fresh_app(url, transaction=MODES[mode] == "true")
    running, done = threading.Event(), threading.Event()

    @app.task("long")
    def long(job: Any, session: Any) -> None:
        running.set()
        done.wait(300)

    app.enqueue(None, "long", {})
    worker = app.worker(queues=["default"], install_signal_handlers=False, maintenance=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    running.wait(120)
    args = {"timeout": busy_timeout} if url.startswith("sqlite") else {}
    engine = sa.create_engine(url, connect_args=args)
    times, failures = [], 0
    try:
        for n in range(probes):
            started = time.perf_counter()
            try:
                with engine.begin() as conn:
                    app.enqueue(conn, "probe", {"n": n}, queue="probes")
                times.append((time.perf_counter() - started) * 1000)
            except sa.exc.OperationalError:
                failures += 1
    finally:
        done.set()
        worker.stop()
        thread.join(60)
        engine.dispose()
    return {
        "median_ms": statistics.median(times) if times else None,
        "max_ms": max(times) if times else None,
        "failed": failures,
        "probes": probes,
    }


def describe(result: dict[str, Any]) -> str:
    rates, lines = result["processing"], []
    lines.append(f"{result['database']} ({result['strategy'] or 'default strategy'}), "
                 f"{result['jobs']} no-op jobs, median of {result['rounds']} rounds:")  # fmt: skip
    for mode, rate in rates.items():
        lines.append(f"  {mode:15} {rate:10.0f} jobs/s")
    lines.append("enqueues from another connection while one long job runs:")
    for mode, cost in result["long_job"].items():
        median = "-" if cost["median_ms"] is None else f"{cost['median_ms']:.1f} ms"
        worst = "-" if cost["max_ms"] is None else f"{cost['max_ms']:.1f} ms"
        lines.append(f"  {mode:15} median {median}, max {worst}, "
                     f"{cost['failed']} of {cost['probes']} failed")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--strategy")
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--busy-timeout", type=float, default=2.0)
    args = parser.parse_args()
    url = URLS[args.database]
    result = {
        "database": args.database,
        "strategy": args.strategy,
        "jobs": args.jobs,
        "rounds": args.rounds,
        "processing": processing(url, args.jobs, args.rounds, args.strategy),
        "long_job": {
            mode: long_job_cost(url, mode, args.probes, args.busy_timeout) for mode in MODES
        },
    }
    print(machine())
    print(describe(result))
    suffix = f"-{args.strategy}" if args.strategy else ""
    print(f"saved {save(f'modes-{args.database}{suffix}', result)}")


if __name__ == "__main__":
    main()

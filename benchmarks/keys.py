"""Keys: the head-of-line figure, and what keys cost enqueue and processing.

    python -m benchmarks.keys postgresql|mariadb|sqlite [--jobs 10000] [--blocked 100000]
        [--cost-jobs 5000] [--chunk 1000] [--concurrency 4] [--batch-size 10] [--rounds 3]
        [--prefix bench_keys_]

Head of line: W1 processing (``jobs`` unkeyed no-op jobs drained by one worker process) with no
keyed job in the table, and with ``blocked`` jobs waiting behind one key whose head is running
(its row marked ``running``, as a worker elsewhere would hold it). The line stays in the table
across rounds: between modes it is parked in another queue with one UPDATE, so each round
alternates the two modes under the same conditions. The issue's target: ratio >= 0.8.

Cost: ``cost_jobs`` jobs enqueued one per transaction, then with ``enqueue_many`` (``chunk`` per
call), then drained — once unkeyed and once each with a key of its own (an idle key: the common
case, one upsert and, at the end, one DELETE of the busy-key row per job), in alternating order.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import sqlalchemy as sa

from benchmarks.common import PREFIX, URLS, fresh_app, machine, save, server_version
from benchmarks.throughput import HERE, analyze, run_worker_process

KEYS_PREFIX = f"{PREFIX}keys_"


def clear(app: Any, engine: sa.Engine, keep_line: bool) -> None:
    """Delete the jobs (all, or all but the parked/blocked line) and the busy keys."""
    j = app.tables.jobs
    with engine.begin() as conn:
        where = [j.c["key"].is_(None)] if keep_line else []
        conn.execute(sa.delete(j).where(*where))
        if not keep_line:
            conn.execute(sa.delete(app.tables.keys))


def drain(url: str, app: Any, engine: sa.Engine, options: list[str], jobs: int) -> float:
    analyze(app, engine)
    report = run_worker_process(url, *options)
    assert report["succeeded"] == jobs, report
    return report["succeeded"] / report["seconds"]


def make_line(app: Any, engine: sa.Engine, blocked: int) -> None:
    """One key whose head is running and ``blocked`` jobs behind it, parked in queue 'parked'."""
    j = app.tables.jobs
    for first in range(0, blocked + 1, 10_000):
        count = min(10_000, blocked + 1 - first)
        batch = [{"task": "noop", "key": "busy", "queue": "parked"} for _ in range(count)]
        app.enqueue_many(engine, batch)
    with engine.begin() as conn:
        conn.execute(sa.update(j).where(j.c.key_seq == 1).values(status="running"))


def park(app: Any, engine: sa.Engine, queue: str) -> None:
    j = app.tables.jobs
    with engine.begin() as conn:
        conn.execute(sa.update(j).where(j.c["key"] == "busy").values(queue=queue))


def head_of_line(args: argparse.Namespace, options: list[str]) -> dict[str, Any]:
    url = URLS[args.database]
    app = fresh_app(url, args.prefix)
    engine = app.create_engine(pool_pre_ping=False)
    rates: dict[str, list[float]] = {"no_keyed_jobs": [], "behind_busy_key": []}
    try:
        make_line(app, engine, args.blocked)
        for index in range(args.rounds):
            for mode in sorted(rates, reverse=index % 2 == 1):
                clear(app, engine, keep_line=True)
                park(app, engine, "default" if mode == "behind_busy_key" else "parked")
                jobs = [{"task": "noop", "payload": {"n": i}} for i in range(args.jobs)]
                app.enqueue_many(engine, jobs)
                rates[mode].append(drain(url, app, engine, options, args.jobs))
    finally:
        engine.dispose()
    free, behind = (statistics.median(rates[m]) for m in ("no_keyed_jobs", "behind_busy_key"))
    return {
        "no_keyed_jobs_per_s": round(free),
        "behind_busy_key_jobs_per_s": round(behind),
        "head_of_line_ratio": round(behind / free, 3),
        "per_round": {mode: [round(x) for x in values] for mode, values in rates.items()},
    }


def enqueue_rates(app: Any, engine: sa.Engine, jobs: int, chunk: int, keyed: bool) -> tuple:
    """(one per transaction, enqueue_many) in jobs/s; each keyed job has a key of its own."""

    def spec(i: int) -> dict[str, Any]:
        return {"task": "noop", "payload": {"n": i}, **({"key": f"k{i}"} if keyed else {})}

    single = jobs // 5
    started = time.perf_counter()
    with engine.connect() as conn:
        for i in range(single):
            with conn.begin():
                item = spec(i)
                app.enqueue(conn, "noop", item["payload"], key=item.get("key"))
    one = single / (time.perf_counter() - started)
    started = time.perf_counter()
    with engine.connect() as conn:
        for first in range(single, jobs, chunk):
            with conn.begin():
                app.enqueue_many(conn, [spec(i) for i in range(first, min(jobs, first + chunk))])
    many = (jobs - single) / (time.perf_counter() - started)
    return one, many


def key_cost(args: argparse.Namespace, options: list[str]) -> dict[str, Any]:
    url = URLS[args.database]
    app = fresh_app(url, args.prefix)
    engine = app.create_engine(pool_pre_ping=False)
    rates: dict[str, list[float]] = {}
    try:
        for index in range(args.rounds):
            for mode in sorted(("unkeyed", "keyed"), reverse=index % 2 == 1):
                clear(app, engine, keep_line=False)
                one, many = enqueue_rates(app, engine, args.cost_jobs, args.chunk, mode == "keyed")
                process = drain(url, app, engine, options, args.cost_jobs)
                for name, value in (("enqueue_single", one), ("enqueue_many", many)):
                    rates.setdefault(f"{name}_{mode}", []).append(value)
                rates.setdefault(f"process_{mode}", []).append(process)
    finally:
        engine.dispose()
    med = {name: statistics.median(values) for name, values in rates.items()}
    result: dict[str, Any] = {}
    for what in ("enqueue_single", "enqueue_many", "process"):
        result[f"{what}_unkeyed_jobs_per_s"] = round(med[f"{what}_unkeyed"])
        result[f"{what}_keyed_jobs_per_s"] = round(med[f"{what}_keyed"])
        result[f"{what}_keyed_ratio"] = round(med[f"{what}_keyed"] / med[f"{what}_unkeyed"], 3)
    result["per_round"] = {name: [round(x) for x in values] for name, values in rates.items()}
    return result


def describe(result: dict[str, Any]) -> str:
    hol, cost = result["head_of_line"], result["cost"]
    lines = [
        f"keys, {result['database']} ({result['server']}; one worker process, concurrency "
        f"{result['concurrency']}, batch {result['batch_size']}; medians of {result['rounds']} "
        "rounds)"
    ]
    if hol is not None:
        lines.append(
            f"  head of line: {result['jobs']} unkeyed no-op jobs with no keyed job "
            f"{hol['no_keyed_jobs_per_s']} jobs/s, behind one running key with {result['blocked']} "
            f"jobs waiting {hol['behind_busy_key_jobs_per_s']} jobs/s, ratio "
            f"{hol['head_of_line_ratio']} (target >= 0.8); per round {hol['per_round']}"
        )
    if cost is None:
        return "\n".join(lines)
    for what, label in (
        ("enqueue_single", "enqueue, one per transaction"),
        ("enqueue_many", "enqueue_many"),
        ("process", "processing"),
    ):
        lines.append(
            f"  {label}: unkeyed {cost[f'{what}_unkeyed_jobs_per_s']} jobs/s, keyed (a key per "
            f"job) {cost[f'{what}_keyed_jobs_per_s']} jobs/s, ratio {cost[f'{what}_keyed_ratio']}"
        )
    lines.append(f"  cost per round: {cost['per_round']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--blocked", type=int, default=100_000)
    parser.add_argument("--cost-jobs", type=int, default=5_000)
    parser.add_argument("--chunk", type=int, default=1_000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefix", default=KEYS_PREFIX)
    parser.add_argument("--only", choices=("head-of-line", "cost"), help="run one part")
    args = parser.parse_args()
    os.chdir(HERE.parent)
    options = ["--burst", "--concurrency", str(args.concurrency)]
    options += ["--batch-size", str(args.batch_size), "--prefix", args.prefix]
    result = {
        "workload": "keys: head of line, and the cost of keys on enqueue and processing",
        "database": args.database,
        "server": server_version(URLS[args.database]),
        "jobs": args.jobs,
        "blocked": args.blocked,
        "cost_jobs": args.cost_jobs,
        "concurrency": args.concurrency,
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "head_of_line": head_of_line(args, options) if args.only != "cost" else None,
        "cost": key_cost(args, options) if args.only != "head-of-line" else None,
    }
    print(machine())
    print(describe(result))
    suffix = f"-{args.only}" if args.only else ""
    print(f"saved {save(f'keys-{args.database}{suffix}', result)}")


if __name__ == "__main__":
    main()

"""``make bench DB=…``: every workload on one database, one table, saved to results/.

    python -m benchmarks.run postgresql|mariadb|sqlite [--quick]

Runs W1 (throughput and the bare-SQL ceiling, and processing with the per-job log line off and
on), W2 (wake-up latency), the ``app.call`` round trip, W3 (load on the database), the
100,000-job memory run, the other claim strategies, and the cost as work grows (issue 19):
history (W1 on a table holding 1,100,000 finished and scheduled jobs), scale-out (1 to 8
worker processes on 100,000 jobs) and an idle fleet (50 idle worker processes for 60 s).
Prints Markdown tables and writes them to ``benchmarks/results/<database>.md``; each workload
saves its own JSON file, and ``run-<database>.json`` the run's date and each stage's duration
(``benchmarks.report`` builds the README's tables from these files).
``--quick`` shrinks every workload (a smoke run, not figures to publish).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import time
from pathlib import Path
from typing import Any

from benchmarks import (
    call,
    history,
    idle_fleet,
    latency,
    load,
    memory,
    scaleout,
    strategies,
    throughput,
)
from benchmarks.common import RESULTS, URLS, machine, save

HERE = Path(__file__).resolve().parent


def explain_claim(database: str, jobs: int) -> str:
    """The server's plan for the claim on a table of ``jobs`` runnable jobs."""
    from benchmarks.common import fresh_app

    app = fresh_app(URLS[database])
    app.enqueue_many(None, [{"task": "noop", "payload": {"n": i}} for i in range(jobs)])
    throughput.analyze(app, app.engine)
    return history.claim_plan(app)


def table(
    w1: dict[str, Any],
    w2: dict[str, Any],
    w3: dict[str, Any],
    mem: dict[str, Any],
    jlog: dict,
    rt: dict[str, Any],
) -> str:
    lat = w2["latency_ms"]
    trip = rt["round_trip_ms"]
    p, idle = w3["processing"], w3["idle_worker"]
    ceiling = w1["process_ceiling_jobs_per_s"]
    rows = [
        (f"W1 enqueue, one job per transaction ({w1['single']:,} jobs)",
         f"{w1['enqueue_single_jobs_per_s']:,} jobs/s",
         f"{w1['enqueue_single_ceiling_jobs_per_s']:,} jobs/s",
         f"{w1['enqueue_single_ratio']:.2f}"),
        (f"W1 enqueue_many ({w1['jobs'] - w1['single']:,} jobs, {w1['chunk']:,} per call)",
         f"{w1['enqueue_bulk_jobs_per_s']:,} jobs/s",
         f"{w1['enqueue_bulk_ceiling_jobs_per_s']:,} jobs/s", f"{w1['enqueue_bulk_ratio']:.2f}"),
        (f"W1 processing (concurrency {w1['concurrency']}, batch {w1['batch_size']})",
         f"{w1['process_jobs_per_s']:,} jobs/s",
         f"{ceiling[str(w1['batch_size'])]:,} jobs/s (batch 1: {ceiling['1']:,})",
         f"{w1['process_ratio']:.2f}"),
        (f"W1 processing, per-job log line on (`--log-jobs`, JSON to a pipe; "
         f"{jlog['rounds']} rounds)", f"{jlog['log_jobs_on_jobs_per_s']:,} jobs/s",
         f"log off: {jlog['log_jobs_off_jobs_per_s']:,} jobs/s", f"{jlog['log_jobs_ratio']:.2f}"),
        (f"W2 wake-up latency ({w2['wake_up']})",
         f"p50 {lat['p50']} ms, p95 {lat['p95']} ms, p99 {lat['p99']} ms", "", ""),
        (f"`app.call` round trip ({rt['wake_up']})",
         f"p50 {trip['p50']} ms, p95 {trip['p95']} ms, p99 {trip['p99']} ms", "", ""),
        ("W3 per processed job",
         f"{p['statements_per_job']} statements, {p['commits_per_job']} commits", "", ""),
        ("W3 idle worker (concurrency 4)",
         f"{idle['statements_per_minute']} statements/min, {idle['commits_per_minute']} "
         "commits/min", "", ""),
        (f"Memory over {mem['jobs']:,} jobs",
         f"RSS {mem['rss_warm_kib'] / 1024:.1f} MiB warm → {mem['rss_end_kib'] / 1024:.1f} MiB "
         "at the end", "", ""),
    ]  # fmt: skip
    server = ", ".join(f"{k} {v}" for k, v in p["server_per_job"].items())
    lines = [
        f"### {w1['server']} — {dt.date.today().isoformat()}, {machine()}",
        "",
        "| workload | dbqueue | bare SQL, same driver | ratio |",
        "|---|---|---|---|",
        *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows),
    ]
    if server:
        lines += ["", f"Server counters per processed job: {server}."]
    return "\n".join(lines)


STRATEGIES = {
    "postgresql": ("advisory_lock", "lock_server"),
    "mariadb": ("advisory_lock", "lock_server"),
    "sqlite": ("lock_server",),
}


def other_strategies(database: str, quick: bool) -> dict[str, tuple[dict, dict]]:
    """W1 processing and W2 latency with each non-default strategy, same parameters."""
    found = {}
    for strategy in STRATEGIES[database]:
        # Against the default in alternating rounds: the ratio holds however the machine drifts.
        w1 = strategies.run(database, strategy, 2_000 if quick else 20_000, 1 if quick else 3)
        print(strategies.describe(w1), flush=True)
        w2 = latency.run(database, 20 if quick else 200, 0.02, strategy)
        print(f"W2 latency ({strategy}): {w2['latency_ms']}", flush=True)
        save(f"strategy-{database}-{strategy}", w1)
        save(f"latency-{database}-{strategy}", w2)
        found[strategy] = (w1, w2)
    return found


DEFAULT_STRATEGY = {"postgresql": "skip_locked", "mariadb": "skip_locked", "sqlite": "sqlite"}


def strategies_table(w1: dict, w2: dict, others: dict[str, tuple[dict, dict]]) -> str:
    default = f"{DEFAULT_STRATEGY[w1['database']]} (default)"
    rows = [(default, w1, w2), *((k, a, b) for k, (a, b) in others.items())]
    lines = [
        "Claim strategies on the same database (W1 processing, W2 wake-up):",
        "",
        "| strategy | processing | wake-up | p50 | p95 | p99 |",
        "|---|---|---|---|---|---|",
    ]
    for name, a, b in rows:
        lat = b["latency_ms"]
        lines.append(
            f"| {name} | {a['process_jobs_per_s']:,} jobs/s | {b['wake_up']} | {lat['p50']} ms "
            f"| {lat['p95']} ms | {lat['p99']} ms |"
        )
    return "\n".join(lines)


def growth(database: str, quick: bool, stages: dict[str, float]) -> dict[str, dict]:
    """The cost as work grows (issue 19): history, scale-out, idle fleet; each saved."""
    found: dict[str, dict] = {}
    began = time.monotonic()
    if quick:
        found["history"] = history.run(database, 20_000, 2_000, 2_000, 1)
    else:
        found["history"] = history.run(database, 1_000_000, 100_000, 20_000, 3)
    print(history.describe(found["history"]), flush=True)
    stages["history"], began = time.monotonic() - began, time.monotonic()
    found["scaleout"] = scaleout.run(database, 5_000 if quick else 100_000,
                                     [1, 2] if quick else [1, 2, 4, 8])  # fmt: skip
    print(scaleout.describe(found["scaleout"]), flush=True)
    stages["scaleout"], began = time.monotonic() - began, time.monotonic()
    found["idle-fleet"] = idle_fleet.run(database, 3 if quick else 50, 5 if quick else 60)
    print(idle_fleet.describe(found["idle-fleet"]), flush=True)
    stages["idle-fleet"] = time.monotonic() - began
    for name, result in found.items():
        save(f"{name}-{database}", result)
    return found


def growth_text(found: dict[str, dict]) -> str:
    """The growth workloads as printed, in a code block (the report makes the tables)."""
    described = [
        history.describe(found["history"]),
        scaleout.describe(found["scaleout"]),
        idle_fleet.describe(found["idle-fleet"]),
    ]
    return "Cost as work grows:\n\n```\n" + "\n".join(described) + "\n```"


def timed(stages: dict[str, float], name: str, work: Any, *args: Any) -> Any:
    began = time.monotonic()
    result = work(*args)
    stages[name] = time.monotonic() - began
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    os.chdir(HERE.parent)
    quick, db, began = args.quick, args.database, time.monotonic()
    stages: dict[str, float] = {}
    n, single = (2_000, 200) if quick else (20_000, 2_000)
    w1 = timed(stages, "throughput", throughput.run, db, n, single, 1_000, 4, 10, None)
    print(throughput.describe(w1), flush=True)
    jlog = timed(stages, "joblog", throughput.job_log_cost, db, n, 4, 10, 1 if quick else 3)
    print(throughput.describe_job_log(jlog), flush=True)
    w2 = timed(stages, "latency", latency.run, db, 20 if quick else 200, 0.02, None)
    print(f"W2 latency: {w2['latency_ms']}", flush=True)
    rt = timed(stages, "call", call.run, db, 20 if quick else 200, 0.02, None)
    print(call.describe(rt, w2), flush=True)
    w3 = timed(stages, "load", load.run, db, n, 5 if quick else 30)
    print(load.describe(w3), flush=True)
    mem = timed(stages, "memory", memory.run, db, 10_000 if quick else 100_000)
    print(memory.describe(mem), flush=True)
    results = (("throughput", w1), ("joblog", jlog), ("latency", w2), ("call", rt),
               ("load", w3), ("memory", mem))  # fmt: skip
    for name, result in results:
        save(f"{name}-{db}", result)
    others = timed(stages, "strategies", other_strategies, db, quick)
    plan = explain_claim(db, n)
    grown = growth(db, quick, stages)
    text = "\n\n".join(
        [
            table(w1, w2, w3, mem, jlog, rt),
            strategies_table(w1, w2, others),
            f"The claim's plan (EXPLAIN):\n\n```\n{plan}\n```",
            growth_text(grown),
        ]
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{db}.md").write_text(text + "\n")
    total = time.monotonic() - began
    stages = {k: round(v) for k, v in stages.items()}
    save(f"run-{db}", {"database": db, "quick": quick, "seconds": round(total), "stages": stages})
    print()
    print(text)
    print(f"\nmake bench DB={db}: {total / 60:.1f} min; stages (s): {stages}")


if __name__ == "__main__":
    main()

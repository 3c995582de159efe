"""Batch handlers: a no-op ``@app.batch_task`` next to a no-op ``@app.task`` (jobs/s).

    python -m benchmarks.batch postgresql|mariadb|sqlite [--jobs 5000] [--rounds 3]
        [--max-size 100] [--concurrency 1] [--prefix bench_batch_]

Each round fills a fresh table with ``jobs`` no-op jobs of one task (``enqueue_many``, 1,000
per call), then a burst worker in this process (the database's default strategy, batch size
10) drains it; the two kinds alternate, which goes first changing each round. The batch task
has ``max_wait=0``: the table is full, so every call gets ``max_size`` jobs. Figures: the
median jobs/s of each, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import sqlalchemy as sa

from benchmarks.common import URLS, fresh_app, save, server_version


def drain(url: str, prefix: str, kind: str, jobs: int, max_size: int, concurrency: int) -> float:
    app = fresh_app(url, prefix)
    if kind == "batch":
        app.batch_task("noop", max_size=max_size, max_wait=0)(lambda jobs, session: None)
    else:
        app.task("noop")(lambda job, session: None)
    for start in range(0, jobs, 1000):
        app.enqueue_many(None, [{"task": "noop"}] * min(1000, jobs - start))
    started = time.perf_counter()
    summary = app.run_worker(burst=True, concurrency=concurrency, install_signal_handlers=False)
    seconds = time.perf_counter() - started
    engine = app.create_engine()
    with engine.connect() as conn:
        jobs_table = app.tables.jobs
        done = conn.execute(
            sa.select(sa.func.count()).where(jobs_table.c.status == "succeeded")
        ).scalar()
    engine.dispose()
    assert done == jobs == summary.succeeded, (done, jobs, summary)
    return jobs / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-size", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--prefix", default="bench_batch_")
    args = parser.parse_args()
    url = URLS[args.database]
    rates: dict[str, list[float]] = {"task": [], "batch": []}
    for round_ in range(args.rounds):
        order = ["task", "batch"] if round_ % 2 == 0 else ["batch", "task"]
        for kind in order:
            rate = drain(url, args.prefix, kind, args.jobs, args.max_size, args.concurrency)
            rates[kind].append(rate)
            print(f"round {round_ + 1} {kind}: {rate:,.0f} jobs/s", flush=True)
    task, batch = (statistics.median(rates[k]) for k in ("task", "batch"))
    print(
        f"{server_version(url)}: no-op task {task:,.0f} jobs/s, no-op batch_task "
        f"(max_size={args.max_size}) {batch:,.0f} jobs/s, {batch / task:.1f}x"
    )
    save(
        f"batch-{args.database}",
        {
            "jobs": args.jobs,
            "rounds": args.rounds,
            "max_size": args.max_size,
            "concurrency": args.concurrency,
            "task_jobs_per_s": rates["task"],
            "batch_jobs_per_s": rates["batch"],
            "median_task": round(task),
            "median_batch": round(batch),
        },
    )


if __name__ == "__main__":
    main()

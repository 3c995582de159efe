"""W1 processing by an async worker: no-op ``async def`` handlers next to plain ``def`` ones.

    python -m benchmarks.asyncio_worker postgresql|mariadb|sqlite [--jobs 20000]
        [--concurrency 4] [--batch-size 10] [--strategy NAME] [--rounds 3] [--prefix bench_]

Each round drains a freshly filled table of no-op jobs once with plain handlers (the sync worker:
threads, the sync driver) and once with ``async def`` handlers (the async worker: slots on an
event loop, the asyncio driver), in alternating order, with the same worker process options;
then the bare ceiling (``benchmarks.ceiling``: claim + complete as bare SQL through the sync
driver, same concurrency and batch size) and, on PostgreSQL, the asyncio ceiling: the same bare
SQL through asyncpg itself, ``concurrency`` tasks on one event loop. Figures are medians of the
rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

from benchmarks import ceiling
from benchmarks.common import PREFIX, URLS, fresh_app, save, server_version
from benchmarks.throughput import (
    HERE,
    alternate_modes,
    analyze,
    bare_rows,
    bulk_insert_bare,
    empty,
)


def run(
    database: str,
    jobs: int,
    concurrency: int,
    batch_size: int,
    rounds: int,
    strategy: str | None,
    prefix: str = PREFIX,
) -> dict[str, Any]:
    url = URLS[database]
    app = fresh_app(url, prefix)
    engine = app.create_engine(pool_pre_ping=False)
    options = ["--burst", "--concurrency", str(concurrency), "--batch-size", str(batch_size)]
    options += ["--prefix", prefix, *(["--strategy", strategy] if strategy else [])]
    modes: dict[str, tuple[str, ...]] = {"sync": (), "async": ("--async-handlers",)}
    rates: dict[str, list[float]] = {"sync": [], "async": [], "bare": []}
    rows = bare_rows(jobs)
    try:
        for _ in range(rounds):
            for mode, values in alternate_modes(app, engine, url, jobs, 1, options, modes).items():
                rates[mode] += values
            empty(app, engine)
            bulk_insert_bare(url, app.names.jobs, rows, 1000)
            analyze(app, engine)
            n, seconds = ceiling.drain(url, app.names.jobs, concurrency, batch_size)
            rates["bare"].append(n / seconds)
            if database == "postgresql":
                empty(app, engine)
                bulk_insert_bare(url, app.names.jobs, rows, 1000)
                analyze(app, engine)
                n, seconds = asyncio.run(
                    drain_asyncpg(url, app.names.jobs, concurrency, batch_size)
                )
                rates.setdefault("bare_asyncpg", []).append(n / seconds)
    finally:
        engine.dispose()
    med = {mode: statistics.median(values) for mode, values in rates.items()}
    return {
        "workload": "W1 processing, sync and async handlers",
        "database": database,
        "server": server_version(url),
        "strategy": strategy or "default",
        "jobs": jobs,
        "concurrency": concurrency,
        "batch_size": batch_size,
        "rounds": rounds,
        "sync_jobs_per_s": round(med["sync"]),
        "async_jobs_per_s": round(med["async"]),
        "ceiling_jobs_per_s": round(med["bare"]),
        "asyncpg_ceiling_jobs_per_s": round(med["bare_asyncpg"]) if "bare_asyncpg" in med else None,
        "async_to_sync": round(med["async"] / med["sync"], 2),
        "async_to_ceiling": round(med["async"] / med["bare"], 2),
        "per_round": {mode: [round(x) for x in values] for mode, values in rates.items()},
    }


async def drain_asyncpg(url: str, table: str, concurrency: int, batch: int) -> tuple[int, float]:
    """The ceiling's claim + complete through asyncpg: ``concurrency`` tasks, one connection
    each, on this loop, until no job is left; returns (jobs, seconds)."""
    import asyncpg
    import sqlalchemy as sa

    parsed = sa.engine.make_url(url)
    claim = ceiling.CLAIM["postgresql"].format(t=table).replace("%s", "$1")
    complete = ceiling.COMPLETE["postgresql"].format(t=table).replace("%s", "$1")
    connections = [
        await asyncpg.connect(
            host=parsed.host, port=parsed.port, user=parsed.username, database=parsed.database
        )
        for _ in range(concurrency)
    ]

    async def run(conn: Any) -> int:
        done = 0
        while True:
            async with conn.transaction():
                ids = [row[0] for row in await conn.fetch(claim, batch)]
                if ids:
                    await conn.execute(complete, ids)
            if not ids:
                return done
            done += len(ids)

    started = time.perf_counter()
    counts = await asyncio.gather(*(run(conn) for conn in connections))
    seconds = time.perf_counter() - started
    for conn in connections:
        await conn.close()
    return sum(counts), seconds


def describe(result: dict[str, Any]) -> str:
    return (
        f"W1 processing ({result['database']} {result['server']}, strategy "
        f"{result['strategy']}, {result['jobs']} no-op jobs, one worker process, concurrency "
        f"{result['concurrency']}, batch {result['batch_size']}): sync worker "
        f"{result['sync_jobs_per_s']} jobs/s, async worker {result['async_jobs_per_s']} jobs/s "
        f"(async/sync {result['async_to_sync']}), bare ceiling {result['ceiling_jobs_per_s']} "
        f"jobs/s (async/ceiling {result['async_to_ceiling']}), bare asyncpg "
        f"{result['asyncpg_ceiling_jobs_per_s']} jobs/s; medians of {result['rounds']} "
        f"rounds, per round {result['per_round']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--strategy")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefix", default=PREFIX, help="table prefix")
    args = parser.parse_args()
    os.chdir(HERE.parent)
    result = run(
        args.database,
        args.jobs,
        args.concurrency,
        args.batch_size,
        args.rounds,
        args.strategy,
        args.prefix,
    )
    suffix = f"-{args.strategy}" if args.strategy else ""
    save(f"asyncio-{args.database}{suffix}", result)
    print(describe(result))


if __name__ == "__main__":
    main()

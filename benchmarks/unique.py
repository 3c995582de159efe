"""The cost of unique keys on enqueue: one job per transaction, plain vs ``unique_key``.

    python -m benchmarks.unique postgresql|mariadb|sqlite [--jobs N] [--rounds R]

Three modes, each ``app.enqueue`` in a transaction of its own on one connection, measured in
alternating blocks of 200 jobs (a commit waits for the disk, whose speed drifts within seconds
on a shared machine): ``plain`` (no key), ``unique`` (a new key each time: the job is inserted
and takes its key) and ``conflict`` (``on_conflict="skip"`` on a key a waiting job holds: the
enqueue finds the holder and keeps it). Prints jobs/s per mode (median of the rounds) and the
ratio to ``plain``, and saves ``results/unique-<database>.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from benchmarks.common import PREFIX, URLS, fresh_app, machine, save, server_version

HERE = Path(__file__).resolve().parent
BLOCK = 200
MODES = ("plain", "unique", "conflict")


def enqueue_block(app: Any, engine: sa.Engine, mode: str, first: int, count: int) -> float:
    """``count`` enqueues of one mode, one per transaction; returns seconds."""
    started = time.perf_counter()
    with engine.connect() as conn:
        for i in range(first, first + count):
            options: dict[str, Any] = {}
            if mode == "unique":
                options = {"unique_key": f"new:{i}"}
            elif mode == "conflict":
                options = {"unique_key": f"held:{i % BLOCK}", "on_conflict": "skip"}
            with conn.begin():
                app.enqueue(conn, "noop", {"n": i}, **options)
    return time.perf_counter() - started


def run(database: str, jobs: int, rounds: int, prefix: str = PREFIX) -> dict[str, Any]:
    url = URLS[database]
    app = fresh_app(url, prefix)
    engine = app.create_engine(pool_pre_ping=False)
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        for index in range(rounds):
            with engine.begin() as conn:
                conn.execute(sa.delete(app.tables.jobs))
                conn.execute(sa.delete(app.tables.unique))
            enqueue_block(app, engine, "conflict", 0, BLOCK)  # the keys conflict mode meets
            seconds = dict.fromkeys(MODES, 0.0)
            for first in range(BLOCK, BLOCK + jobs, BLOCK):
                order = MODES if (first // BLOCK + index) % 2 else tuple(reversed(MODES))
                for mode in order:
                    seconds[mode] += enqueue_block(app, engine, mode, first, BLOCK)
            for mode in MODES:
                rates[mode].append(jobs / seconds[mode])
        with engine.connect() as conn:
            held = conn.execute(sa.select(sa.func.count()).select_from(app.tables.unique))
            keys = held.scalar_one()
    finally:
        engine.dispose()
    assert keys == BLOCK + jobs, keys  # every "unique" job holds its key; conflicts added none
    medians = {mode: statistics.median(values) for mode, values in rates.items()}
    return {
        "workload": "enqueue one job per transaction: plain, unique key (new), unique key (held)",
        "database": database,
        "server": server_version(url),
        "jobs_per_mode_per_round": jobs,
        "rounds": rounds,
        **{f"{mode}_jobs_per_s": round(rate) for mode, rate in medians.items()},
        "unique_ratio": round(medians["unique"] / medians["plain"], 3),
        "conflict_ratio": round(medians["conflict"] / medians["plain"], 3),
        "per_round": {mode: [round(x) for x in values] for mode, values in rates.items()},
    }


def describe(result: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"enqueue, one job per transaction ({result['database']}, {result['server']}, "
            f"{result['jobs_per_mode_per_round']} jobs per mode, {result['rounds']} rounds):",
            f"  plain                      {result['plain_jobs_per_s']:>7,} jobs/s",
            f"  unique_key, new key        {result['unique_jobs_per_s']:>7,} jobs/s "
            f"({result['unique_ratio']:.2f} of plain)",
            f"  unique_key, held (skip)    {result['conflict_jobs_per_s']:>7,} jobs/s "
            f"({result['conflict_ratio']:.2f} of plain)",
            "  per round: " + "; ".join(f"{k} {v}" for k, v in result["per_round"].items()),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefix", default=PREFIX, help="table prefix")
    args = parser.parse_args()
    os.chdir(HERE.parent)
    result = run(args.database, args.jobs, args.rounds, args.prefix)
    print(machine())
    print(describe(result))
    print(f"saved {save(f'unique-{args.database}', result)}")


if __name__ == "__main__":
    main()

"""Claim strategies side by side: W1 processing with a non-default strategy and with the
database's default, in alternating rounds on the same table.

    python -m benchmarks.strategies postgresql|mariadb|sqlite --strategy NAME [--jobs 20000]
        [--rounds 3]

Each round fills the table with ``jobs`` no-op jobs and drains it with one worker process
(concurrency 4, batch 10) once per strategy, in alternating order (``alternate_modes``), so
drift on the machine, which moved one run's figures against another's by up to 2x, weighs on
both alike. The ratio is the median of the rounds' own ratios: each compares two drains seconds
apart. ``lock_server`` claims through a ``dbqueue server`` started for the run (the default
strategy's drains ignore it). Target (issue 19): >= 0.5 of the default.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from pathlib import Path
from typing import Any

from benchmarks.common import URLS, fresh_app, lock_server, machine, save, server_version
from benchmarks.throughput import alternate_modes

HERE = Path(__file__).resolve().parent
CONCURRENCY, BATCH_SIZE = 4, 10


def run(database: str, strategy: str, jobs: int, rounds: int) -> dict[str, Any]:
    """``strategy`` and the default, each draining ``jobs`` once a round, ``rounds`` rounds."""
    url = URLS[database]
    app = fresh_app(url)
    engine = app.create_engine(pool_pre_ping=False)
    options = ["--burst", "--concurrency", str(CONCURRENCY), "--batch-size", str(BATCH_SIZE)]
    server = lock_server(url) if strategy == "lock_server" else contextlib.nullcontext()
    try:
        with server as address:
            chosen = ("--strategy", strategy, *(("--lock-server", address) if address else ()))
            modes: dict[str, tuple[str, ...]] = {"default": (), strategy: chosen}
            rates = alternate_modes(app, engine, url, jobs, rounds, options, modes)
    finally:
        engine.dispose()
    ratios = [mine / base for mine, base in zip(rates[strategy], rates["default"], strict=True)]
    return {
        "workload": "W1 processing, a claim strategy against the default",
        "database": database,
        "server": server_version(url),
        "strategy": strategy,
        "jobs": jobs,
        "concurrency": CONCURRENCY,
        "batch_size": BATCH_SIZE,
        "rounds": rounds,
        "process_jobs_per_s": round(statistics.median(rates[strategy])),
        "default_jobs_per_s": round(statistics.median(rates["default"])),
        "ratio_to_default": round(statistics.median(ratios), 2),
        "per_round": {mode: [round(x) for x in values] for mode, values in rates.items()},
    }


def describe(result: dict[str, Any]) -> str:
    return (
        f"W1 processing, strategy {result['strategy']} against the default "
        f"({result['database']}, {result['jobs']} no-op jobs, concurrency "
        f"{result['concurrency']}, batch {result['batch_size']}): {result['process_jobs_per_s']} "
        f"jobs/s against {result['default_jobs_per_s']}, ratio {result['ratio_to_default']} "
        f"(median of {result['rounds']} rounds' ratios; per round {result['per_round']})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.chdir(HERE.parent)
    result = run(args.database, args.strategy, args.jobs, args.rounds)
    print(machine())
    print(describe(result))
    print(f"saved {save(f'strategy-{args.database}-{args.strategy}', result)}")


if __name__ == "__main__":
    main()

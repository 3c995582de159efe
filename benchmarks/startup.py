"""Start-up — what ``import dbqueue`` and ``dbqueue --help`` cost over their floors.

    python -m benchmarks.startup [--rounds 15] [--checkout DIR] [--name startup]

Each command runs in a fresh interpreter (``sys.executable``, the checkout first on
PYTHONPATH), timed from spawn to exit. A round runs every command once, in an order rotated
from round to round, so that the machine's load falls on all of them alike; a first round warms
the bytecode caches and is not counted. Printed and saved: each command's median, and the
ratios the targets are about, both measured in the same run on the same machine:

- ``import dbqueue`` over ``import sqlalchemy`` (target: at most 1.3);
- ``dbqueue --help`` (the console script's code) over ``import sqlalchemy, click`` (target: at
  most 1.5).

``from dbqueue import App`` is reported too, for reference (it loads the job engine and the
worker, not a database's modules, Alembic or an optional extra). ``--checkout`` measures
another tree (an older commit, unpacked) the same way, for a before/after comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import machine, save

ROOT = Path(__file__).resolve().parents[1]
#: Each measured command: its name → the interpreter's arguments.
COMMANDS: dict[str, list[str]] = {
    "import sqlalchemy": ["-c", "import sqlalchemy"],
    "import dbqueue": ["-c", "import dbqueue"],
    "import sqlalchemy, click": ["-c", "import sqlalchemy, click"],
    "dbqueue --help": ["-c", "from dbqueue.cli import main; main()", "--help"],  # the script's
    "from dbqueue import App": ["-c", "from dbqueue import App"],
}
#: The targets: (measured, floor) → the largest ratio allowed.
TARGETS = {
    ("import dbqueue", "import sqlalchemy"): 1.3,
    ("dbqueue --help", "import sqlalchemy, click"): 1.5,
}


def run_once(arguments: list[str], checkout: Path) -> float:
    """Seconds from spawning a fresh interpreter running ``arguments`` to its exit."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, *arguments],
        cwd=checkout,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def measure(rounds: int, checkout: Path) -> dict[str, list[float]]:
    """Every command once per round, the order rotated each round; the first round unrecorded."""
    names = list(COMMANDS)
    for name in names:  # warm-up: bytecode caches, the OS's file cache
        run_once(COMMANDS[name], checkout)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_number in range(rounds):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(run_once(COMMANDS[name], checkout))
    return times


def report(times: dict[str, list[float]]) -> dict[str, Any]:
    """Medians, and the targets' ratios of medians; the ratios of the fastest runs as well (on a
    busy machine the least disturbed run of each, for comparison)."""
    medians = {name: statistics.median(values) for name, values in times.items()}
    fastest = {name: min(values) for name, values in times.items()}
    ratios = {
        f"{measured} / {floor}": {
            "ratio": round(medians[measured] / medians[floor], 3),
            "target": limit,
            "met": medians[measured] / medians[floor] <= limit,
            "ratio_of_fastest": round(fastest[measured] / fastest[floor], 3),
        }
        for (measured, floor), limit in TARGETS.items()
    }
    return {
        "median_ms": {name: round(value * 1000, 1) for name, value in medians.items()},
        "min_ms": {name: round(value * 1000, 1) for name, value in fastest.items()},
        "ratios": ratios,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the tree to measure")
    parser.add_argument("--name", default="startup", help="results file name (without .json)")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    result = report(measure(args.rounds, checkout))
    print(f"{machine()}, {args.rounds} rounds, {checkout}")
    for name, value in result["median_ms"].items():
        print(f"  {name:<26} median {value:7.1f} ms   min {result['min_ms'][name]:7.1f} ms")
    for name, ratio in result["ratios"].items():
        verdict = "met" if ratio["met"] else "NOT MET"
        print(
            f"  {name:<42} {ratio['ratio']:.2f} (target ≤ {ratio['target']}: {verdict}; "
            f"fastest runs: {ratio['ratio_of_fastest']:.2f})"
        )
    path = save(args.name, {"rounds": args.rounds, "checkout": str(checkout), **result})
    print(f"saved {path}")


if __name__ == "__main__":
    main()

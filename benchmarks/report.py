"""The README's Performance figures, rebuilt from the last ``make bench`` runs' result files.

    python -m benchmarks.report [--readme README.md] [--check]

Reads ``benchmarks/results/<workload>-<database>.json`` (only the names ``make bench`` writes:
provisional files under other names are ignored) and ``run-<database>.json`` (the run's date
and length), and replaces what lies between ``<!-- bench:start -->`` and ``<!-- bench:end -->``
in the README with the tables: the workloads on each database, the claim strategies, the cost
as work grows, and issue 19's targets as ratios. Each table names the files it comes from and
their dates; a file older than its database's ``make bench`` run (so not from that run) is
flagged. ``--check`` only says whether the README is up to date (exit status 1 if not).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
DATABASES = {"postgresql": "PostgreSQL", "mariadb": "MariaDB", "sqlite": "SQLite"}
MAIN_FILES = ("throughput", "joblog", "latency", "call", "load", "memory")
GROWTH_FILES = ("history", "scaleout", "idle-fleet")
STRATEGIES = {
    "postgresql": ("advisory_lock", "lock_server"),
    "mariadb": ("advisory_lock", "lock_server"),
    "sqlite": ("lock_server",),
}
Cell = Callable[[dict[str, dict]], str]


class Results:
    """The result files of each database, loaded once, and the ones a table used."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.used: dict[str, set[str]] = {db: set() for db in DATABASES}

    def get(self, db: str, name: str) -> dict[str, Any] | None:
        path = self.directory / f"{name}.json"
        if not path.exists():
            return None
        self.used[db].add(name)
        return json.loads(path.read_text())

    def of(self, db: str, *workloads: str) -> dict[str, dict]:
        """``{workload: result}`` for one database (missing files left out)."""
        found = {}
        for workload in workloads:
            result = self.get(db, f"{workload}-{db}")
            if result is not None:
                found[workload] = result
        return found

    def sources(self) -> str:
        """The files the tables since the last call used, with their dates; then forget them."""
        parts = []
        for db, names in self.used.items():
            run = self.get_quiet(f"run-{db}")
            dated: dict[str, list[str]] = {}
            for name in sorted(names):
                dated.setdefault(self.stamp(name, run), []).append(f"`{name}`")
            parts += [
                f"{DATABASES[db]}, {date}: {', '.join(files)}" for date, files in dated.items()
            ]
            names.clear()
        if not parts:
            return ""
        return "From `benchmarks/results/<name>.json`: " + "; ".join(parts) + "."

    def get_quiet(self, name: str) -> dict[str, Any] | None:
        path = self.directory / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def stamp(self, name: str, run: dict[str, Any] | None) -> str:
        """The file's date; flagged when it is older than its database's ``make bench`` run."""
        date = (self.get_quiet(name) or {}).get("date", "")
        if run is None or not date:
            return date[:10]
        began = dt.datetime.fromisoformat(run["date"]) - dt.timedelta(seconds=run["seconds"] + 60)
        if dt.datetime.fromisoformat(date) < began:
            return f"{date[:10]} (**not from the `make bench` run of {run['date'][:10]}**)"
        return date[:10]


def n(value: float) -> str:
    return f"{round(value):,}"


def ms(summary: dict[str, float]) -> str:
    return f"{summary['p50']} / {summary['p95']} / {summary['p99']} ms"


def markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    # A "|" inside a cell would end it (plans print with them).
    return lines + [
        "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows
    ]


def grid(results: Results, workloads: tuple[str, ...], rows: list[tuple[str, Cell]]) -> list[str]:
    """One row per (label, cell); one column per database, from that database's files."""
    found = {db: results.of(db, *workloads) for db in DATABASES}
    body = []
    for label, cell in rows:
        cells = []
        for db in DATABASES:
            try:
                cells.append(cell(found[db]))
            except (KeyError, TypeError, ZeroDivisionError):
                cells.append("—")
        body.append([label, *cells])
    return markdown(["", *DATABASES.values()], body)


def main_rows() -> list[tuple[str, Cell]]:
    def t(f: dict) -> dict:
        return f["throughput"]

    return [
        ("enqueue, one job per transaction", lambda f: f"{n(t(f)['enqueue_single_jobs_per_s'])} "
         f"jobs/s (bare {n(t(f)['enqueue_single_ceiling_jobs_per_s'])}: "
         f"{t(f)['enqueue_single_ratio']:.2f})"),
        ("`enqueue_many`, 1,000 per call", lambda f: f"{n(t(f)['enqueue_bulk_jobs_per_s'])} "
         f"jobs/s (bare {n(t(f)['enqueue_bulk_ceiling_jobs_per_s'])}: "
         f"{t(f)['enqueue_bulk_ratio']:.2f})"),
        ("processing, concurrency 4, batch 10", lambda f: f"{n(t(f)['process_jobs_per_s'])} "
         f"jobs/s (bare {n(t(f)['process_ceiling_jobs_per_s']['10'])}: "
         f"{t(f)['process_ratio']:.2f})"),
        ("bare claim one job at a time",
         lambda f: f"{n(t(f)['process_ceiling_jobs_per_s']['1'])} jobs/s"),
        ("processing with the per-job log line on / off",
         lambda f: f"{f['joblog']['log_jobs_ratio']:.2f}"),
        ("wake-up p50 / p95 / p99",
         lambda f: f"{ms(f['latency']['latency_ms'])} ({f['latency']['wake_up']})"),
        ("`app.call` round trip p50 / p95 / p99", lambda f: ms(f["call"]["round_trip_ms"])),
        ("per processed job (worker side)",
         lambda f: f"{f['load']['processing']['statements_per_job']:.1f} statements, "
         f"{f['load']['processing']['commits_per_job']:.1f} commits"),
        ("per processed job (server side)", lambda f: ", ".join(
            f"{k} {v}" for k, v in f["load"]["processing"]["server_per_job"].items()
            if k in ("xact_commit", "tup_returned", "Com_commit", "Questions")) or "—"),
        ("idle worker, concurrency 4, maintenance on",
         lambda f: f"{f['load']['idle_worker']['statements_per_minute']:g} statements/min"),
        ("worker RSS over 100,000 jobs: after 10,000 → after 100,000 (once stopped)",
         lambda f: f"{f['memory']['rss_warm_kib'] / 1024:.1f} → "
         f"{f['memory']['rss_last_kib'] / 1024:.1f} MiB "
         f"({f['memory']['rss_end_kib'] / 1024:.1f})"),
    ]  # fmt: skip


def strategy_cell(results: Results, db: str, strategy: str) -> str:
    if strategy not in STRATEGIES[db]:
        return "—"
    w1 = results.get(db, f"strategy-{db}-{strategy}")
    w2 = results.get(db, f"latency-{db}-{strategy}")
    if not (w1 and w2):
        return "not measured"
    lat = w2["latency_ms"]
    return (f"{n(w1['process_jobs_per_s'])} jobs/s ({w1['ratio_to_default']:.2f} of the "
            f"default's {n(w1['default_jobs_per_s'])} in the same rounds); "
            f"{lat['p50']} / {lat['p99']} ms ({w2['wake_up']})")  # fmt: skip


def strategies_table(results: Results) -> list[str]:
    rows = [
        [f"`{s}`", *(strategy_cell(results, db, s) for db in DATABASES)]
        for s in ("advisory_lock", "lock_server")
    ]
    return markdown(
        [
            "strategy (W1 processing, rounds alternating with the default; W2 p50 / p99)",
            *DATABASES.values(),
        ],
        rows,
    )


def curve(f: dict) -> str:
    result = f["scaleout"]
    points = ", ".join(f"{p['processes']}: {n(p['jobs_per_s'])}" for p in result["curve"])
    threads = result.get("thread_handling")
    server = f"; the server's `thread_handling`: {threads}" if threads else ""
    return f"{points} ({n(result['jobs'])} jobs{server})"


def bare_curve(f: dict) -> str:
    """The ceiling's fleets: jobs/s by size, dbqueue's share of each, and their own ratio."""
    result = f["scaleout"]
    if "bare_curve" not in result:
        return "not measured in this run"
    points = ", ".join(
        f"{p['processes']}: {n(p['jobs_per_s'])} ({ours['ratio_to_bare']:.2f})"
        for p, ours in zip(result["bare_curve"], result["curve"], strict=True)
    )
    ratio = result["bare_ratio_max_to_1"]
    return f"{points}; largest / one: {ratio:.2f} (in brackets: dbqueue / bare)"


def commits(f: dict) -> str:
    last = f["scaleout"]["curve"][-1]
    server = [f"{k.removesuffix('_per_s')} {n(v)}" for k, v in last.items()
              if k in ("xact_commit_per_s", "Com_commit_per_s")]  # fmt: skip
    return ", ".join(server + [f"client {n(last['client_commits_per_s'])}"]) + "/s"


def fleet_cell(f: dict) -> str:
    r = f["idle-fleet"]
    per = r["per_worker_statements_per_minute"]["median"]
    text = f"{r['workers']} workers, {r['seconds']:g} s: {per:g} statements/min each (client count)"
    if r["server_connections"] is not None:
        server = {
            k: v for k, v in r.items() if k in ("transactions_per_minute", "questions_per_minute")
        }
        counted = ", ".join(f"{n(v)} {k.replace('_', ' ')}" for k, v in server.items())
        text += (f"; server: {r['server_connections']} connections "
                 f"({r['connections_per_worker']:g} per worker), {counted}")  # fmt: skip
    if r.get("cut_by_max_connections"):
        text += (f" (fleet cut from {r['workers_wanted']} by `max_connections`: it would hold "
                 f"{n(r['connections_for_wanted'])} connections)")  # fmt: skip
    return text


def growth_rows() -> list[tuple[str, Cell]]:
    def h(f: dict) -> dict:
        return f["history"]

    return [
        ("history: W1 processing, full table / empty table",
         lambda f: f"{h(f)['history_ratio']:.2f} ({n(h(f)['history_jobs_per_s'])} / "
         f"{n(h(f)['empty_jobs_per_s'])} jobs/s; {n(h(f)['finished'])} finished + "
         f"{n(h(f)['scheduled'])} scheduled jobs, seeded in {h(f)['seed']['seed_seconds']:g} s)"),
        ("history: the claim's plan", lambda f: plan_summary(h(f)["claim_plan"])),
        ("scale-out, jobs/s by worker processes", curve),
        ("scale-out, largest fleet / one process",
         lambda f: f"{f['scaleout']['ratio_max_to_1']:.2f}"),
        ("scale-out, the same fleets running bare SQL", bare_curve),
        ("scale-out, commits/s with the largest fleet", commits),
        ("idle fleet", fleet_cell),
    ]  # fmt: skip


def plan_summary(plan: str) -> str:
    """The plan's line naming the claim index (or its first line, flagged)."""
    for line in plan.splitlines():
        if "_claim" in line:
            found = re.search(r"(Index Scan using \S+|USING INDEX \S+|range \| \S+)", line)
            text = found.group(1) if found else line.strip()
            return f"on its index: `{text.replace(' | ', ' on ')}`"
    return f"**not on its index**: `{plan.splitlines()[0] if plan else '?'}`"


def ratio_keys(w1: dict) -> list[str]:
    """One-job enqueue ratios in the W1 result: the classic one, and any added (Session…)."""
    return [k for k in w1 if k.startswith("enqueue_") and k.endswith("ratio") and "bulk" not in k]


def one_job(w1: dict, key: str) -> str:
    """The verdict, and SQLAlchemy's own ratio for the same shape where the run measured it."""
    floor = w1.get("sqlalchemy_floor_ratios", {}).get(key)
    alone = "" if floor is None else f"; SQLAlchemy alone, same shape, no dbqueue: {floor:.2f}"
    return verdict(w1[key], 0.9) + alone


def verdict(value: float, target: float) -> str:
    return f"{value:.2f} ({'met' if value >= target else '**not met**'})"


def issue7_rows(results: Results) -> list[list[str]]:
    """The earlier targets (issue 7): processing near the ceiling, PostgreSQL's wake-up,
    flat memory."""
    rows = []
    for db, name in DATABASES.items():
        w1, found = results.get(db, f"throughput-{db}"), results.of(db, "latency", "memory")
        if w1 and db != "sqlite":
            rows.append([f"{name}: processing / bare", "≥ 0.7", verdict(w1["process_ratio"], 0.7)])
        if "latency" in found and db == "postgresql":
            lat = found["latency"]["latency_ms"]
            met = "met" if lat["p50"] <= 1 and lat["p99"] <= 5 else "**not met**"
            rows.append([f"{name}: wake-up", "p50 ≤ 1 ms, p99 ≤ 5 ms",
                         f"{lat['p50']} / {lat['p99']} ms ({met})"])  # fmt: skip
        if "memory" in found:
            growth = found["memory"]["growth_after_warm_kib"] / 1024
            met = "met" if abs(growth) <= 1 else "**not met**"
            rows.append([f"{name}: memory over 100,000 jobs", "flat (±1 MiB after warm-up)",
                         f"{growth:+.1f} MiB ({met})"])  # fmt: skip
    return rows


def target_rows(results: Results) -> list[list[str]]:
    rows = []
    for db, name in DATABASES.items():
        w1, run = results.get(db, f"throughput-{db}"), results.of(db, *GROWTH_FILES)
        for strategy in STRATEGIES[db]:
            other = results.get(db, f"strategy-{db}-{strategy}")
            if other:
                value = other["ratio_to_default"]
                rows.append(
                    [f"{name}: `{strategy}` / default processing", "≥ 0.5", verdict(value, 0.5)]
                )
        if w1:
            rows.append(enqueue_many_row(name, w1))
            rows += [[f"{name}: one-job enqueue / bare (`{k}`)", "≥ 0.9", one_job(w1, k)]
                     for k in ratio_keys(w1)]  # fmt: skip
        if w1 and db == "sqlite":
            rows.append([f"{name}: processing / bare", "≥ 0.8", verdict(w1["process_ratio"], 0.8)])
        if "history" in run:
            value = run["history"]["history_ratio"]
            plan = plan_summary(run["history"]["claim_plan"])
            rows.append(
                [
                    f"{name}: history / empty",
                    "≥ 0.9, on the index",
                    f"{verdict(value, 0.9)}; {plan}",
                ]
            )
        if "scaleout" in run:
            scale = run["scaleout"]
            bare = (f" (bare SQL's fleet: {scale['bare_ratio_max_to_1']:.2f})"
                    if "bare_ratio_max_to_1" in scale else "")  # fmt: skip
            rows.append([f"{name}: scale-out, largest fleet / one process", "≥ 1.0",
                         verdict(scale["ratio_max_to_1"], 1.0) + bare])  # fmt: skip
    return rows


def enqueue_many_row(name: str, w1: dict) -> list[str]:
    rate, ratio = w1["enqueue_bulk_jobs_per_s"], w1["enqueue_bulk_ratio"]
    if name == "PostgreSQL":
        met = "met" if rate >= 50_000 else "**not met**"
        return [
            f"{name}: `enqueue_many`",
            "≥ 50,000 jobs/s",
            f"{n(rate)} jobs/s ({met}; {ratio:.2f} of bare)",
        ]
    return [
        f"{name}: `enqueue_many` / bare multi-row INSERT",
        "≥ 0.8",
        f"{verdict(ratio, 0.8)}; {n(rate)} jobs/s",
    ]


def run_line(results: Results) -> str:
    parts = []
    for db, name in DATABASES.items():
        run, w1 = results.get_quiet(f"run-{db}"), results.get_quiet(f"throughput-{db}")
        if run:
            server = w1["server"] if w1 else name
            quick = " (**`--quick`: a smoke run, not figures to publish**)" if run["quick"] else ""
            parts.append(f"{server}: {run['date'][:16].replace('T', ' ')} UTC, "
                         f"{run['seconds'] / 60:.0f} min{quick}")  # fmt: skip
    machine = next((r["machine"] for db in DATABASES if (r := results.get_quiet(f"run-{db}"))), "")
    if not parts:
        return "No `make bench` run recorded yet (`benchmarks/results/run-<db>.json`)."
    return f"`make bench` runs on {machine}: " + "; ".join(parts) + "."


def block(results: Results) -> str:
    sections = [
        "<!-- generated by `make bench-report` (python -m benchmarks.report) from "
        "benchmarks/results/*.json: edit benchmarks/report.py, not this block -->",
        run_line(results),
        "\n".join(grid(results, MAIN_FILES, main_rows())),
        results.sources(),
        "The other claim strategies on the same databases:",
        "\n".join(strategies_table(results)),
        results.sources(),
        "Cost as work grows (issue 19):",
        "\n".join(grid(results, GROWTH_FILES, growth_rows())),
        results.sources(),
        "Issue 19's targets, as ratios from these files:",
        "\n".join(markdown(["target", "aim", "result"], target_rows(results))),
        results.sources(),
        "The earlier targets (issue 7):",
        "\n".join(markdown(["target", "aim", "result"], issue7_rows(results))),
        results.sources(),
    ]
    return "\n\n".join(s for s in sections if s)


def replace_block(text: str, generated: str) -> str:
    if START not in text or END not in text:
        raise SystemExit(
            f"README has no {START} … {END} markers: add them to the Performance section"
        )
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{generated}\n{END}{tail}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if the README is stale")
    args = parser.parse_args()
    generated = block(Results(RESULTS))
    text = args.readme.read_text()
    updated = replace_block(text, generated)
    if args.check:
        print(
            "README up to date"
            if updated == text
            else "README's figures are stale: make bench-report"
        )
        sys.exit(0 if updated == text else 1)
    args.readme.write_text(updated)
    print(generated)
    print(f"\nwrote {args.readme}")


if __name__ == "__main__":
    main()

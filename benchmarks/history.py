"""History: W1 processing on a table that already holds a million finished jobs.

    python -m benchmarks.history postgresql|mariadb|sqlite [--finished 1000000]
        [--scheduled 100000] [--jobs 20000] [--rounds 3]

A second table (prefix ``benchhist_``) is seeded with ``finished`` finished jobs (95 %
succeeded, 3 % dead, 2 % cancelled, finished over the last 24 hours, twenty tasks, the W1
jobs' queue) and ``scheduled`` jobs waiting for later (``available``, ``run_at`` 1 to 24 hours
ahead). Seeding is set-based: a thousandth of the rows is inserted from Python, then one
``INSERT … SELECT`` multiplies it by a series (PostgreSQL ``generate_series``, MariaDB's
``seq_1_to_N`` sequence table, SQLite a recursive CTE) with the secondary indexes dropped, which
are then built again (denser than in a table grown job by job); then ``ANALYZE``. Each round
fills the empty table and the history table with the same ``jobs`` W1 jobs and drains each with
one worker process (concurrency 4, batch 10), in alternating order, after a warm-up drain of a
tenth as many on each (the first drain after seeding reads cold pages); the drained jobs are
deleted again.
Target (issue 19): history ≥ 0.9 of empty, the claim on its index (the plan is printed).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import statistics
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import dbqueue
from benchmarks.common import PREFIX, URLS, fresh_app, machine, save, server_version
from benchmarks.throughput import analyze, empty, run_worker_process

HERE = Path(__file__).resolve().parent
HISTORY_PREFIX = "benchhist_"
COPIES = 1_000  # each template row becomes this many rows


def series(backend: str, count: int) -> sa.FromClause:
    """A FROM clause with ``count`` rows, built by the database itself."""
    if backend == "postgresql":
        return sa.func.generate_series(1, count).table_valued("n").render_derived("series")
    if backend in ("mysql", "mariadb"):
        return sa.table(f"seq_1_to_{count}", sa.column("seq"))
    start = sa.select(sa.literal(1).label("n")).cte("series", recursive=True)
    return start.union_all(sa.select(start.c.n + 1).where(start.c.n < count))


def templates(finished: int, scheduled: int) -> list[list[dict[str, Any]]]:
    """A thousandth of the history, as rows (finished, then scheduled); ``seed`` multiplies
    them."""
    now = dt.datetime.now(dt.timezone.utc)
    rows, later_rows = [], []
    for i in range(finished // COPIES):
        status = "dead" if i % 100 < 3 else "cancelled" if i % 100 < 5 else "succeeded"
        end = now - dt.timedelta(seconds=86_400 * i / (finished // COPIES))
        begun = end - dt.timedelta(milliseconds=5 + i % 50)
        rows.append(
            {"task": f"task_{i % 20}", "payload": {"order": i}, "status": status,
             "dead": status == "dead", "run_at": begun, "created_at": begun,
             "started_at": begun, "finished_at": end, "updated_at": end, "attempt": 1,
             "message": "RuntimeError: boom" if status == "dead" else None}
        )  # fmt: skip
    for i in range(scheduled // COPIES):
        later = now + dt.timedelta(seconds=3_600 + 82_800 * i / (scheduled // COPIES))
        later_rows.append({"task": f"task_{i % 20}", "payload": {"later": i}, "run_at": later})
    return [rows, later_rows]


def seed(app: dbqueue.App, finished: int, scheduled: int) -> dict[str, Any]:
    """Fill the history table (set-based), ANALYZE it; returns what was done and how long."""
    jobs = app.tables.jobs
    started = time.perf_counter()
    copied = [c for c in jobs.c if c.name != "id"]
    with app.engine.begin() as conn:
        for rows in templates(finished, scheduled):
            conn.execute(jobs.insert(), rows)
        for index in jobs.indexes:  # built once after the copy: far faster than row by row
            index.drop(conn)
        many = series(conn.dialect.name, COPIES - 1)
        source = sa.select(*copied).select_from(jobs.join(many, sa.true()))
        conn.execute(jobs.insert().from_select([c.name for c in copied], source))
        for index in jobs.indexes:
            index.create(conn)
    seeded = time.perf_counter() - started
    analyze_all(app)
    with app.engine.connect() as conn:
        top = conn.execute(sa.select(sa.func.max(jobs.c.id))).scalar_one()
        count = conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one()
    return {
        "rows": count,
        "last_id": top,
        "seed_seconds": round(seeded, 1),
        "analyze_seconds": round(time.perf_counter() - started - seeded, 1),
    }


def analyze_all(app: dbqueue.App) -> None:
    """Fresh statistics, as autovacuum (PostgreSQL) and InnoDB's auto-recalculation (MariaDB)
    keep them; SQLite has none unless the application runs ANALYZE, which it does here."""
    engine = app.create_engine()
    table = app.names.jobs
    statement = {"postgresql": f"ANALYZE {table}", "sqlite": "ANALYZE"}
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(statement.get(conn.dialect.name, f"ANALYZE TABLE {table}")))
    engine.dispose()


def claim_plan(app: dbqueue.App) -> str:
    """The server's plan for the claim (``runnable``, with SKIP LOCKED where used)."""
    engine = app.create_engine()
    try:
        with engine.connect() as conn:
            stmt = app.queue_engine(conn).claims.runnable("default", 10)
            if conn.dialect.name != "sqlite":
                stmt = stmt.with_for_update(skip_locked=True)
            sql = str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
            prefix = "EXPLAIN QUERY PLAN " if conn.dialect.name == "sqlite" else "EXPLAIN "
            rows = conn.execute(sa.text(prefix + sql)).all()
            conn.rollback()
    finally:
        engine.dispose()
    return "\n".join(" | ".join(str(v) for v in row) for row in rows)


def fill(app: dbqueue.App, engine: sa.Engine, jobs: int) -> None:
    app.enqueue_many(engine, [{"task": "noop", "payload": {"n": i}} for i in range(jobs)])
    analyze(app, engine)


def clear_run(app: dbqueue.App, engine: sa.Engine, last_id: int) -> None:
    """Delete what a round added to the history table, keeping the history."""
    with engine.begin() as conn:
        conn.execute(sa.delete(app.tables.jobs).where(app.tables.jobs.c.id > last_id))
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f"VACUUM {app.names.jobs}"))


def drop(app: dbqueue.App) -> None:
    """Drop the history's tables: a million rows are not left behind on a developer's disk."""
    engine = app.create_engine()
    with engine.begin() as conn:
        for table in (*app.names.all, app.names.version_table):
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text(f"DROP FUNCTION IF EXISTS {app.names.jobs}_notify()"))
    if engine.dialect.name == "sqlite":  # give the file's freed pages back to the disk
        import sqlite3

        with contextlib.closing(sqlite3.connect(engine.url.database, isolation_level=None)) as db:
            db.execute("VACUUM")
    engine.dispose()


def drain(url: str, prefix: str, jobs: int) -> float:
    report = run_worker_process(url, "--burst", "--prefix", prefix, "--concurrency", "4",
                                "--batch-size", "10")  # fmt: skip
    assert report["succeeded"] == jobs, report
    return report["succeeded"] / report["seconds"]


def run(database: str, finished: int, scheduled: int, jobs: int, rounds: int) -> dict[str, Any]:
    url = URLS[database]
    plain, history = fresh_app(url), fresh_app(url, HISTORY_PREFIX)
    seeded = seed(history, finished, scheduled)
    print(f"  seeded {seeded}", flush=True)
    engines = {"empty": plain.create_engine(), "history": history.create_engine()}
    apps = {"empty": plain, "history": history}
    prefixes = {"empty": PREFIX, "history": HISTORY_PREFIX}
    rates: dict[str, list[float]] = {"empty": [], "history": []}
    plan = ""
    try:
        for mode in rates:  # warm-up: each table's pages read once before measuring
            fill(apps[mode], engines[mode], jobs // 10)
            drain(url, prefixes[mode], jobs // 10)
            clear_run(apps[mode], engines[mode], seeded["last_id"] if mode == "history" else 0)
        for index in range(rounds):
            for mode in sorted(rates, reverse=index % 2 == 1):
                fill(apps[mode], engines[mode], jobs)
                if mode == "history" and not plan:
                    plan = claim_plan(history)
                rates[mode].append(drain(url, prefixes[mode], jobs))
                if mode == "history":
                    clear_run(history, engines[mode], seeded["last_id"])
                else:
                    empty(plain, engines[mode])
    finally:
        for engine in engines.values():
            engine.dispose()
        drop(history)
    med = {mode: statistics.median(values) for mode, values in rates.items()}
    return {
        "workload": "history: W1 processing on a table holding finished and scheduled jobs",
        "database": database,
        "server": server_version(url),
        "finished": finished,
        "scheduled": scheduled,
        "seed": seeded,
        "jobs": jobs,
        "concurrency": 4,
        "batch_size": 10,
        "rounds": rounds,
        "empty_jobs_per_s": round(med["empty"]),
        "history_jobs_per_s": round(med["history"]),
        "history_ratio": round(med["history"] / med["empty"], 2),
        "per_round": {mode: [round(x) for x in values] for mode, values in rates.items()},
        "claim_plan": plan,
    }


def describe(result: dict[str, Any]) -> str:
    seeded = result["seed"]
    return "\n".join(
        [
            f"History {result['database']} ({result['server']}): {result['finished']:,} finished "
            f"+ {result['scheduled']:,} scheduled jobs (seeded in {seeded['seed_seconds']} s, "
            f"ANALYZE {seeded['analyze_seconds']} s), W1 processing of {result['jobs']:,} jobs, "
            f"concurrency {result['concurrency']}, batch {result['batch_size']}",
            f"  empty table: {result['empty_jobs_per_s']:,} jobs/s; with history: "
            f"{result['history_jobs_per_s']:,} jobs/s; ratio {result['history_ratio']} "
            f"(medians of {result['rounds']} rounds; per round {result['per_round']})",
            "  the claim's plan on the full table:",
            *(f"    {line}" for line in result["claim_plan"].splitlines()),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--scheduled", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.chdir(HERE.parent)
    result = run(args.database, args.finished, args.scheduled, args.jobs, args.rounds)
    print(machine())
    print(describe(result))
    print(f"saved {save(f'history-{args.database}', result)}")


if __name__ == "__main__":
    main()

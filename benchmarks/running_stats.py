"""What telling running jobs apart costs ``app.stats()`` (the overview, /api/v1/stats, the lag
gauge) on a big table: the same table read with no live worker, then with one live worker
listing ``--listed`` jobs whose rows still say available (jobs run inside their claim's
transaction: the registry is read once, the listed ids looked up by primary key, and the
counts leave them out of the lag).

    python -m benchmarks.running_stats postgresql|mariadb|sqlite [--rows 200000] [--listed 200]

The table (prefix ``benchrun_``, the dashboard benchmark's mix of rows) is kept between runs.
Figures (p50 / max in ms) are printed and saved to results/running-stats-<db>.json; nothing is
asserted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import time
from typing import Any

import sqlalchemy as sa

import dbqueue
from benchmarks.common import URLS, fresh_app, save, summary_ms
from benchmarks.dashboard import CHUNK, _row
from dbqueue.migrations import migrate

PREFIX = "benchrun_"
WORKER = "bench-listing"


def table(url: str, rows: int) -> dbqueue.App:
    """The filled table: kept from an earlier run when it holds ``rows`` jobs."""
    app = dbqueue.App(url, table_prefix=PREFIX)
    try:
        with app.engine.connect() as conn:
            current = migrate.current_revision(conn, app.names) == migrate.head_revision()
            count = conn.execute(sa.select(sa.func.count()).select_from(app.tables.jobs))
            if current and count.scalar_one() == rows:
                return app
    except Exception:  # no tables yet
        pass
    app = fresh_app(url, PREFIX)
    rng, now = random.Random(18), dt.datetime.now(dt.timezone.utc)
    with app.engine.connect() as conn:
        for start in range(0, rows, CHUNK):
            batch = [_row(rng, now, n) for n in range(start, min(rows, start + CHUNK))]
            conn.execute(app.tables.jobs.insert(), batch)
            conn.commit()
    return app


def list_running(app: dbqueue.App, listed: int) -> None:
    """One live worker whose heartbeat lists ``listed`` runnable jobs (none when 0)."""
    jobs = app.tables.jobs
    with app.engine.begin() as conn, app.context.workers_connection(conn) as registry:
        app.queue_engine(registry).workers.unregister_worker(registry, WORKER)
        if not listed:
            return
        ids = conn.execute(
            sa.select(jobs.c.id, jobs.c.queue, jobs.c.task, jobs.c.attempt)
            .where(jobs.c.status == "available", jobs.c.run_at <= sa.func.current_timestamp())
            .order_by(jobs.c.id)
            .limit(listed)
        ).all()
        since = dt.datetime.now(dt.timezone.utc).isoformat()
        entries = [
            {"id": i, "queue": q, "task": t, "attempt": a + 1, "since": since} for i, q, t, a in ids
        ]
        values = {
            "id": WORKER,
            "name": WORKER,
            "host": "bench",
            "pid": 1,
            "queues": [],
            "concurrency": listed,
            "strategy": "any",
            "running": len(entries),
            "jobs": entries,
            "processed": 0,
            "failed": 0,
        }
        app.queue_engine(registry).workers.register_worker(registry, values, 3600)


def timed_stats(app: dbqueue.App, repeat: int) -> tuple[dict[str, float], int]:
    app.stats()  # warm the caches
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        found = app.stats()
        times.append(time.perf_counter() - started)
    return summary_ms(times), sum(s.by_status["running"] for s in found)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--listed", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    app = table(URLS[args.database], args.rows)
    results: dict[str, Any] = {"rows": args.rows}
    print(f"{args.database}, {args.rows:,} jobs: app.stats() p50 / max in ms")
    for listed in (0, args.listed):
        list_running(app, listed)
        figures, running = timed_stats(app, args.repeat)
        results[f"listed={listed}"] = {**figures, "running": running}
        shown = f"{figures['p50']:>9.1f} {figures['max']:>9.1f}"
        print(f"  {listed:>5} listed ({running} running)  {shown}")
    list_running(app, 0)
    save(f"running-stats-{args.database}", results)
    app.engine.dispose()


if __name__ == "__main__":
    main()

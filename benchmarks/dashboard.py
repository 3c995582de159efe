"""The dashboard's response times on a big table (issue 18): the overview and the job list
(first page, a deep page, filters, a text search), the dead jobs page and /api/v1/stats,
served for real by uvicorn on 127.0.0.1 and timed from an HTTP client.

    python -m benchmarks.dashboard postgresql|mariadb|sqlite [--rows 1000000] [--repeat 5]

The table is filled once with a realistic mix (mostly succeeded jobs finished over the last
two hours, some waiting, scheduled, dead and cancelled, five queues, twenty tasks) and kept
(prefix ``benchdash_``) so a second run skips the fill. Each page's SQL alone is timed too: the
gap is the HTTP and template work. Figures are printed and saved to results/dashboard-<db>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import random
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import requests
import sqlalchemy as sa

import dbqueue
from benchmarks.common import URLS, fresh_app, save, summary_ms
from dbqueue.dashboard import create_app
from dbqueue.dashboard import queries as dq
from dbqueue.migrations import migrate

PREFIX = "benchdash_"
CHUNK = 10_000


def table_ready(url: str, rows: int) -> dbqueue.App | None:
    app = dbqueue.App(url, table_prefix=PREFIX)
    try:
        with app.engine.connect() as conn:
            if migrate.current_revision(conn, app.names) != migrate.head_revision():
                return None
            found = conn.execute(sa.select(sa.func.count()).select_from(app.tables.jobs))
            return app if found.scalar_one() == rows else None
    except Exception:
        return None


def fill(url: str, rows: int) -> dbqueue.App:
    app = fresh_app(url, PREFIX)
    rng = random.Random(18)
    now = dt.datetime.now(dt.timezone.utc)
    jobs = app.tables.jobs
    started = time.perf_counter()
    with app.engine.connect() as conn:
        for start in range(0, rows, CHUNK):
            batch = [_row(rng, now, n) for n in range(start, min(rows, start + CHUNK))]
            conn.execute(jobs.insert(), batch)
            conn.commit()
    print(f"filled {rows:,} rows in {time.perf_counter() - started:.0f} s")
    return app


def _row(rng: random.Random, now: dt.datetime, n: int) -> dict[str, Any]:
    roll = rng.random()
    created = now - dt.timedelta(seconds=rng.uniform(0, 7200))
    status, finished, run_at = "succeeded", created + dt.timedelta(seconds=1), created
    if roll < 0.05:
        status, finished = "available", None
    elif roll < 0.06:
        status, finished, run_at = "available", None, now + dt.timedelta(hours=1)
    elif roll < 0.08:
        status = "dead"
    elif roll < 0.085:
        status = "cancelled"
    word = "needle" if n % 250_000 == 7 else "hay"
    return {
        "queue": f"q{n % 5}",
        "task": f"task_{n % 20}",
        "payload": {"order": n, "note": word},
        "status": status,
        "run_at": run_at,
        "created_at": created,
        "updated_at": finished or created,
        "finished_at": finished,
        "attempt": 1 if finished else 0,
        "message": "RuntimeError: boom" if status == "dead" else None,
        "external_key": f"order-{n}",
        "tenant": n % 100,
    }


@contextlib.contextmanager
def served(app: dbqueue.App) -> Iterator[str]:
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(app, read_only=True), port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def pages(app: dbqueue.App) -> dict[str, str]:
    with app.engine.connect() as conn:
        top = conn.execute(sa.select(sa.func.max(app.tables.jobs.c.id))).scalar_one()
    return {
        "overview /": "/",
        "jobs, first page": "/jobs",
        "jobs, a deep page": f"/jobs?before={top // 2}",
        "jobs, queue + status dead": "/jobs?queue=q3&status=dead",
        "jobs, external key": "/jobs?external_key=order-123456",
        "jobs, text in payload (4 hits)": "/jobs?text=needle",
        "dead jobs": "/dead",
        "/api/v1/stats": "/api/v1/stats",
    }


def sql_alone(app: dbqueue.App, repeat: int) -> dict[str, Any]:
    """The pages' main statements without HTTP or templates."""
    timed: dict[str, list[float]] = {"stats (overview)": [], "throughput (overview)": []}
    timed.update({"job list + capped count": []})
    for _ in range(repeat):
        t = time.perf_counter()
        app.stats()
        timed["stats (overview)"].append(time.perf_counter() - t)
        with app.engine.connect() as conn:
            t = time.perf_counter()
            dq.throughput(app, conn)
            timed["throughput (overview)"].append(time.perf_counter() - t)
            t = time.perf_counter()
            dq.list_jobs(app, conn, dq.JobFilter(), None)
            dq.count_jobs(app, conn, dq.JobFilter())
            timed["job list + capped count"].append(time.perf_counter() - t)
    return {name: summary_ms(values) for name, values in timed.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    url = URLS[args.database]
    app = table_ready(url, args.rows) or fill(url, args.rows)
    results: dict[str, Any] = {"rows": args.rows, "pages": {}}
    with served(app) as base:
        for name, path in pages(app).items():
            times = []
            for _ in range(args.repeat + 1):
                t = time.perf_counter()
                response = requests.get(base + path, timeout=600)
                times.append(time.perf_counter() - t)
                assert response.status_code == 200, (path, response.status_code)
            results["pages"][name] = summary_ms(times[1:])  # the first one warms caches
    results["sql"] = sql_alone(app, args.repeat)
    print(f"\n{args.database}, {args.rows:,} jobs: p50 / max in ms over {args.repeat} requests")
    for section in ("pages", "sql"):
        for name, figures in results[section].items():
            print(f"  {name:36} {figures['p50']:>9.1f} {figures['max']:>9.1f}")
    save(f"dashboard-{args.database}", results)
    app.engine.dispose()


if __name__ == "__main__":
    main()

"""Async enqueue next to sync enqueue and the bare drivers (PostgreSQL: asyncpg and psycopg2).

    python -m benchmarks.async_enqueue postgresql|mariadb|sqlite [--single 4000] [--bulk 20000]
        [--no-sync-commit]

One job per transaction on one connection: ``app.enqueue`` (sync), ``app.aenqueue`` on an
AsyncConnection and in an AsyncSession, the bare INSERT+COMMIT through the sync driver, and (on
PostgreSQL) through asyncpg itself — each mode in blocks of 200 jobs, alternating, so that disk
drift weighs on all alike. Then ``enqueue_many`` vs ``aenqueue_many`` (1,000 jobs per call and
transaction), and 8 concurrent callers: 8 threads calling ``enqueue`` vs 8 asyncio tasks calling
``aenqueue`` on one event loop (each caller with a connection of its own).

Each commit waits for the disk, which on a shared machine caps every mode alike; the client CPU
per job (this process's CPU time) is what tells the paths apart. ``--no-sync-commit``
(PostgreSQL) sets ``synchronous_commit = off`` on every connection of the run, so that the
client's cost shows in jobs/s too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from benchmarks import ceiling
from benchmarks.common import URLS, fresh_app, machine, save, server_version
from benchmarks.throughput import bare_rows, empty

HERE = Path(__file__).resolve().parent
BLOCK = 200
CHUNK = 1_000
CALLERS = 8
PREFIX = "bench_async_"
#: PostgreSQL settings for every connection of the run (``--no-sync-commit``).
SERVER_SETTINGS: dict[str, str] = {}


def sync_single(app: Any, engine: sa.Engine, count: int) -> float:
    started = time.perf_counter()
    with engine.connect() as conn:
        for i in range(count):
            with conn.begin():
                app.enqueue(conn, "noop", {"n": i})
    return time.perf_counter() - started


async def async_single(app: Any, engine: Any, count: int) -> float:
    started = time.perf_counter()
    async with engine.connect() as conn:
        for i in range(count):
            async with conn.begin():
                await app.aenqueue(conn, "noop", {"n": i})
    return time.perf_counter() - started


async def async_session_single(app: Any, engine: Any, count: int) -> float:
    from sqlalchemy.ext.asyncio import AsyncSession

    started = time.perf_counter()
    async with AsyncSession(engine) as session:
        for i in range(count):
            async with session.begin():
                await app.aenqueue(session, "noop", {"n": i})
    return time.perf_counter() - started


async def asyncpg_single(url: str, table: str, rows: list[tuple]) -> float:
    """The async ceiling: asyncpg's own INSERT … RETURNING and COMMIT, one job each."""
    import asyncpg

    parsed = sa.engine.make_url(url)
    conn = await asyncpg.connect(
        host=parsed.host,
        port=parsed.port or 5432,
        user=parsed.username,
        password=parsed.password,
        database=parsed.database,
        server_settings=SERVER_SETTINGS,
    )
    sql = ceiling.INSERT["postgresql"].format(t=table)
    for n in range(1, 7):
        sql = sql.replace("%s", f"${n}", 1)
    try:
        started = time.perf_counter()
        for row in rows:
            async with conn.transaction():
                await conn.fetchval(sql, *row)
        return time.perf_counter() - started
    finally:
        await conn.close()


def single(url: str, app: Any, engine: sa.Engine, aengine: Any, run: Callable, total: int) -> dict:
    """Jobs/s and client CPU µs per job of each mode for ``total`` one-per-transaction
    enqueues, in alternating blocks."""
    rows = bare_rows(BLOCK)
    modes: dict[str, Callable[[], float]] = {
        "bare (sync driver)": lambda: ceiling.enqueue_single(url, app.names.jobs, rows),
        "enqueue": lambda: sync_single(app, engine, BLOCK),
        "aenqueue (AsyncConnection)": lambda: run(async_single(app, aengine, BLOCK)),
        "aenqueue (AsyncSession)": lambda: run(async_session_single(app, aengine, BLOCK)),
    }
    if engine.dialect.name == "postgresql":
        modes["bare (asyncpg)"] = lambda: run(asyncpg_single(url, app.names.jobs, rows))
    seconds = dict.fromkeys(modes, 0.0)
    cpu = dict.fromkeys(modes, 0.0)
    for index in range(total // BLOCK):
        for mode in sorted(modes, reverse=index % 2 == 1):
            before = time.process_time()
            seconds[mode] += modes[mode]()
            cpu[mode] += time.process_time() - before
    done = total // BLOCK * BLOCK
    return {
        mode: {
            "jobs_per_s": round(done / seconds[mode]),
            "cpu_us_per_job": round(cpu[mode] / done * 1e6),
        }
        for mode in modes
    }


def bulk(app: Any, engine: sa.Engine, aengine: Any, run: Callable, total: int) -> dict:
    def specs(first: int) -> list[dict[str, Any]]:
        return [{"task": "noop", "payload": {"n": i}} for i in range(first, first + CHUNK)]

    def sync_many() -> float:
        started = time.perf_counter()
        with engine.connect() as conn:
            for first in range(0, total, CHUNK):
                with conn.begin():
                    app.enqueue_many(conn, specs(first))
        return time.perf_counter() - started

    async def async_many() -> float:
        started = time.perf_counter()
        async with aengine.connect() as conn:
            for first in range(0, total, CHUNK):
                async with conn.begin():
                    await app.aenqueue_many(conn, specs(first))
        return time.perf_counter() - started

    rates: dict[str, list[float]] = {"enqueue_many": [], "aenqueue_many": []}
    for index in range(3):
        for mode in sorted(rates, reverse=index % 2 == 1):
            empty(app, engine)
            took = sync_many() if mode == "enqueue_many" else run(async_many())
            rates[mode].append(total / took)
    return {mode: round(sorted(found)[1]) for mode, found in rates.items()}


def concurrent(app: Any, engine: sa.Engine, aengine: Any, run: Callable, total: int) -> dict:
    each = total // CALLERS

    def threads() -> float:
        workers = [
            threading.Thread(target=sync_single, args=(app, engine, each)) for _ in range(CALLERS)
        ]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return time.perf_counter() - started

    async def tasks() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(async_single(app, aengine, each) for _ in range(CALLERS)))
        return time.perf_counter() - started

    seconds = {"enqueue, 8 threads": 0.0, "aenqueue, 8 asyncio tasks": 0.0}
    for index in range(4):
        for mode in sorted(seconds, reverse=index % 2 == 1):
            seconds[mode] += threads() if mode.startswith("enqueue") else run(tasks())
    return {mode: round(4 * each * CALLERS / s) for mode, s in seconds.items()}


def run_all(
    database: str, single_jobs: int, bulk_jobs: int, sync_commit: bool = True
) -> dict[str, Any]:
    url = URLS[database]
    app = fresh_app(url, prefix=PREFIX)
    connect_args: dict[str, Any] = {}
    if not sync_commit and database == "postgresql":
        os.environ["PGOPTIONS"] = "-c synchronous_commit=off"  # libpq: psycopg2's connections
        SERVER_SETTINGS["synchronous_commit"] = "off"
        connect_args = {"server_settings": SERVER_SETTINGS}
    engine = app.create_engine(pool_size=CALLERS + 2)
    loop = asyncio.new_event_loop()
    aengine = app.create_async_engine(pool_size=CALLERS + 2, connect_args=connect_args)
    try:
        run = loop.run_until_complete
        result = {
            "database": database,
            "synchronous_commit": sync_commit,
            "server": server_version(url),
            "machine": machine(),
            "single_jobs_per_s": single(url, app, engine, aengine, run, single_jobs),
            "bulk_jobs_per_s": bulk(app, engine, aengine, run, bulk_jobs),
            "concurrent_jobs_per_s": concurrent(app, engine, aengine, run, single_jobs),
        }
        empty(app, engine)
        return result
    finally:
        loop.run_until_complete(aengine.dispose())
        loop.close()
        engine.dispose()


def describe(result: dict[str, Any]) -> str:
    commit = "" if result["synchronous_commit"] else ", synchronous_commit off"
    lines = [
        f"async enqueue on {result['database']} ({result['server']}{commit}), {result['machine']}",
        "  one job per transaction, one connection:",
    ]
    for mode, found in result["single_jobs_per_s"].items():
        lines.append(
            f"    {mode:<28} {found['jobs_per_s']:>8,} jobs/s  "
            f"{found['cpu_us_per_job']:>5} µs CPU/job"
        )
    for title, key in (
        (f"enqueue_many, {CHUNK:,} jobs per call", "bulk_jobs_per_s"),
        (f"{CALLERS} concurrent callers, one job per transaction", "concurrent_jobs_per_s"),
    ):
        lines.append(f"  {title}:")
        for mode, rate in result[key].items():
            lines.append(f"    {mode:<28} {rate:>8,} jobs/s")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--single", type=int, default=4_000)
    parser.add_argument("--bulk", type=int, default=20_000)
    parser.add_argument("--no-sync-commit", action="store_true")
    args = parser.parse_args()
    result = run_all(args.database, args.single, args.bulk, sync_commit=not args.no_sync_commit)
    print(describe(result))
    suffix = "-nosync" if args.no_sync_commit else ""
    save(f"async_enqueue-{args.database}{suffix}", result)


if __name__ == "__main__":
    main()

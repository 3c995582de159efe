"""The ceiling: dbqueue's work done as bare SQL through the same driver, without dbqueue.

Each function runs the cycle dbqueue runs, on the same migrated table, with raw DB-API calls:
no SQLAlchemy, no Job objects, no handler lookup. dbqueue's figures are printed as a ratio of
these. The SQL here is the benchmark's own, written out per database on purpose.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa


def _connect(url: str) -> Any:
    """A raw DB-API connection from the driver SQLAlchemy would use for ``url``."""
    parsed = sa.engine.make_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        import psycopg2

        return psycopg2.connect(
            host=parsed.host,
            port=parsed.port or 5432,
            user=parsed.username,
            password=parsed.password or "",
            dbname=parsed.database,
        )
    if backend in ("mysql", "mariadb"):
        import pymysql

        conn = pymysql.connect(
            host=parsed.host,
            port=parsed.port or 3306,
            user=parsed.username,
            password=parsed.password or "",
            database=parsed.database,
            autocommit=False,
        )
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        return conn
    import sqlite3

    conn = sqlite3.connect(
        parsed.database, isolation_level=None, timeout=30, check_same_thread=False
    )
    conn.execute("PRAGMA journal_mode=WAL")  # as dbqueue; synchronous stays FULL
    return conn


def _backend(url: str) -> str:
    name = sa.engine.make_url(url).get_backend_name()
    return "mysql" if name == "mariadb" else name


INSERT = {
    "postgresql": "INSERT INTO {t} (task, queue, payload, payload_hash, priority, max_attempts) "
    "VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
    "mysql": "INSERT INTO {t} (task, queue, payload, payload_hash, priority, max_attempts) "
    "VALUES (%s, %s, %s, %s, %s, %s)",
    "sqlite": "INSERT INTO {t} (task, queue, payload, payload_hash, priority, max_attempts) "
    "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
}

CLAIM = {
    "postgresql": "SELECT id, task, payload, attempt FROM {t} WHERE status = 'available' "
    "AND queue = 'default' AND run_at <= statement_timestamp() "
    "ORDER BY priority, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED",
    "mysql": "SELECT id, task, payload, attempt FROM {t} WHERE status = 'available' "
    "AND queue = 'default' AND run_at <= UTC_TIMESTAMP(6) "
    "ORDER BY priority, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED",
}

COMPLETE = {
    "postgresql": "UPDATE {t} SET status = 'succeeded', attempt = attempt + 1, "
    "finished_at = statement_timestamp(), updated_at = statement_timestamp() WHERE id = ANY(%s)",
    "mysql": "UPDATE {t} SET status = 'succeeded', attempt = attempt + 1, "
    "finished_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6) WHERE id IN ({ids})",
}

SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
SQLITE_CLAIM = (
    "SELECT id, task, payload, attempt FROM {t} WHERE status = 'available' AND queue = 'default' "
    f"AND run_at <= {SQLITE_NOW} ORDER BY priority, run_at, id LIMIT ?"
)
SQLITE_COMPLETE = (
    f"UPDATE {{t}} SET status = 'succeeded', attempt = attempt + 1, finished_at = {SQLITE_NOW}, "
    f"updated_at = {SQLITE_NOW} WHERE id IN ({{ids}})"
)


def enqueue_single(url: str, table: str, rows: list[tuple], conn: Any = None) -> float:
    """One INSERT and one COMMIT per job on one connection (``conn``, kept open by the caller
    across blocks as dbqueue's pool keeps its own; else a new one); returns seconds."""
    backend = _backend(url)
    sql = INSERT[backend].format(t=table)
    own = conn is None
    if own:
        conn = _connect(url)
    try:
        started = time.perf_counter()
        if backend == "sqlite":
            for row in rows:
                conn.execute("BEGIN")
                conn.execute(sql, row).fetchone()
                conn.execute("COMMIT")
        else:
            for row in rows:
                with conn.cursor() as cur:
                    cur.execute(sql, row)
                    if backend == "postgresql":
                        cur.fetchone()
                conn.commit()
        return time.perf_counter() - started
    finally:
        if own:
            conn.close()


def drain(url: str, table: str, concurrency: int, batch: int) -> tuple[int, float]:
    """Threads claim up to ``batch`` jobs per transaction and mark them done, until none is
    left; returns (jobs, seconds)."""
    jobs, seconds, _ = drain_counted(url, table, concurrency, batch)
    return jobs, seconds


def drain_counted(url: str, table: str, concurrency: int, batch: int) -> tuple[int, float, int]:
    """``drain``, with the transactions committed (each thread's last one found nothing)."""
    backend = _backend(url)
    cycle: Callable[[Any], int] = (
        _sqlite_cycle(table, batch)
        if backend == "sqlite"
        else _locking_cycle(backend, table, batch)
    )
    counts = [0] * concurrency
    cycles = [0] * concurrency
    errors: list[BaseException] = []
    connections = [_connect(url) for _ in range(concurrency)]
    barrier = threading.Barrier(concurrency + 1)

    def run(index: int) -> None:
        conn = connections[index]
        barrier.wait()
        try:
            while True:
                done = cycle(conn)
                cycles[index] += 1
                if not done:
                    return
                counts[index] += done
        except BaseException as exc:  # reported by the caller: a ceiling must not fail quietly
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    for conn in connections:
        conn.close()
    if errors:
        raise RuntimeError(f"the bare-SQL drain failed: {errors[0]!r}") from errors[0]
    return sum(counts), seconds, sum(cycles)


def _locking_cycle(backend: str, table: str, batch: int) -> Callable[[Any], int]:
    claim = CLAIM[backend].format(t=table)
    complete = COMPLETE[backend]

    def cycle(conn: Any) -> int:
        with conn.cursor() as cur:
            cur.execute(claim, (batch,))
            ids = [row[0] for row in cur.fetchall()]
            if ids:
                if backend == "postgresql":
                    cur.execute(complete.format(t=table), (ids,))
                else:
                    marks = ", ".join(["%s"] * len(ids))
                    cur.execute(complete.format(t=table, ids=marks), ids)
        conn.commit()
        return len(ids)

    return cycle


def _sqlite_cycle(table: str, batch: int) -> Callable[[Any], int]:
    claim = SQLITE_CLAIM.format(t=table)

    def cycle(conn: Any) -> int:
        conn.execute("BEGIN IMMEDIATE")
        ids = [row[0] for row in conn.execute(claim, (batch,)).fetchall()]
        if ids:
            marks = ", ".join(["?"] * len(ids))
            conn.execute(SQLITE_COMPLETE.format(t=table, ids=marks), ids)
        conn.execute("COMMIT")
        return len(ids)

    return cycle

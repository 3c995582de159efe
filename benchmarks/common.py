"""Shared pieces of the benchmarks: database URLs, fresh tables, percentiles, result files."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import dbqueue
from dbqueue.migrations import migrate

URLS = {
    "postgresql": os.environ.get(
        "DBQUEUE_BENCH_POSTGRESQL_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
    ),
    "mariadb": os.environ.get(
        "DBQUEUE_BENCH_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"
    ),
    "sqlite": os.environ.get("DBQUEUE_BENCH_SQLITE_URL", "sqlite:///benchmarks/results/bench.db"),
}
PREFIX = "bench_"
# DBQUEUE_BENCH_RESULTS: write elsewhere (a provisional run on a loaded machine).
RESULTS = Path(os.environ.get("DBQUEUE_BENCH_RESULTS") or Path(__file__).parent / "results")


def fresh_app(url: str, prefix: str = PREFIX, **options: Any) -> dbqueue.App:
    """An App on newly migrated, empty tables."""
    app = dbqueue.App(url, table_prefix=prefix, **options)
    engine = app.create_engine()
    names = app.names
    with engine.begin() as conn:
        for table in (*names.all, names.version_table):
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        if engine.dialect.name == "postgresql":
            conn.execute(sa.text(f"DROP FUNCTION IF EXISTS {names.jobs}_notify()"))
    migrate.upgrade(engine, names)
    engine.dispose()
    return app


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary_ms(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "n": len(ms),
        "p50": round(percentile(ms, 50), 2),
        "p95": round(percentile(ms, 95), 2),
        "p99": round(percentile(ms, 99), 2),
        "mean": round(statistics.fmean(ms), 2) if ms else float("nan"),
        "max": round(max(ms), 2) if ms else float("nan"),
    }


def machine() -> str:
    python = platform.python_version()
    return f"{platform.node()} ({os.cpu_count()} cores, {platform.machine()}, Python {python})"


def server_version(url: str) -> str:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return dbqueue.dialects.for_sqlalchemy(conn.dialect).server_description
    finally:
        engine.dispose()


def server_threads(url: str) -> str | None:
    """How a MariaDB/MySQL server runs its connections (``@@thread_handling``: a thread per
    connection, or its thread pool), which decides how it holds up under many workers on few
    cores (README: "Many workers on a small MariaDB"); None for other databases."""
    engine = sa.create_engine(url)
    try:
        if engine.dialect.name != "mysql":
            return None
        with engine.connect() as conn:
            found = conn.execute(sa.text("SHOW GLOBAL VARIABLES LIKE 'thread_handling'")).first()
        return None if found is None else str(found[1])
    finally:
        engine.dispose()


def save(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        **payload,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2))
    return path


@contextlib.contextmanager
def lock_server(url: str, prefix: str = PREFIX) -> Iterator[str]:
    """A `dbqueue server` on a free port for ``url``'s tables; yields its HOST:PORT."""
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "dbqueue"), "server", "--url", url, "--table-prefix",
             prefix, "--port", "0", "--notify-port", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                found = re.search(r"listening on (\S+?):(\d+)", Path(log.name).read_text())
                if found:
                    break
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"dbqueue server did not start:\n{Path(log.name).read_text()}"
                    )
                time.sleep(0.05)
            yield f"{found.group(1)}:{found.group(2)}"
        finally:
            process.terminate()
            process.wait(30)

"""Several worker processes started together, and what the server sees of them.

Used by ``benchmarks.scaleout`` and ``benchmarks.idle_fleet``: each process is a
``benchmarks.worker_proc`` started with ``--barrier``, so that importing and setting up 50
Python processes on two cores (tens of seconds) is not part of what is measured: the fleet is
released at one moment, once every process is ready.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

HERE = Path(__file__).resolve().parent


class Fleet:
    """``size`` worker processes waiting at a barrier; ``go()`` releases them. ``module`` is
    what each runs: ``benchmarks.worker_proc``, or ``benchmarks.bare_proc`` (the ceiling)."""

    def __init__(
        self, url: str, size: int, options: list[str], ready_timeout: float, module: str
    ) -> None:
        self.barrier = Path(tempfile.mkdtemp(prefix="dbqueue-fleet-"))
        self.size = size
        self.ready_timeout = ready_timeout
        self.processes = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    module,
                    url,
                    *options,
                    "--barrier",
                    str(self.barrier),
                ],
                cwd=HERE.parent,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for _ in range(size)
        ]

    def wait_ready(self) -> float:
        """Seconds until every process is set up and waiting."""
        started = time.monotonic()
        while len(list(self.barrier.glob("ready-*"))) < self.size:
            failed = [p for p in self.processes if p.poll() is not None]
            if failed:
                raise RuntimeError(f"worker process failed:\n{failed[0].stderr.read()[-3000:]}")
            if time.monotonic() - started > self.ready_timeout:
                raise RuntimeError(f"{self.size} worker processes not ready in time")
            time.sleep(0.05)
        return time.monotonic() - started

    def go(self) -> float:
        """Release the fleet; returns the moment (epoch seconds)."""
        moment = time.time()
        (self.barrier / "go").write_text(str(moment))
        return moment

    def reports(self, timeout: float = 1800) -> list[dict[str, Any]]:
        """Each process's JSON report, once all have exited."""
        found = []
        for process in self.processes:
            out, err = process.communicate(timeout=timeout)
            if process.returncode != 0:
                raise RuntimeError(f"worker process failed:\n{err[-3000:]}")
            found.append(json.loads(out.strip().splitlines()[-1]))
        return found

    def stop(self) -> None:
        """SIGTERM every process still running (only the ones this fleet started)."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()


@contextmanager
def fleet(
    url: str,
    size: int,
    options: list[str],
    ready_timeout: float = 600,
    module: str = "benchmarks.worker_proc",
) -> Iterator[Fleet]:
    started = Fleet(url, size, options, ready_timeout, module)
    try:
        yield started
    finally:
        started.stop()
        for process in started.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        for path in started.barrier.iterdir():
            path.unlink()
        started.barrier.rmdir()


def server_connections(url: str) -> int | None:
    """Client connections the server holds for this database (None: SQLite has no server)."""
    return _server_count(
        url,
        postgresql="SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        mysql="SELECT count(*) FROM information_schema.PROCESSLIST "
        "WHERE DB = DATABASE() AND ID <> CONNECTION_ID()",
    )


def free_connections(url: str) -> int | None:
    """Connections the server would still accept (None: no server, no limit)."""
    return _server_count(
        url,
        postgresql="SELECT current_setting('max_connections')::int"
        " - current_setting('superuser_reserved_connections')::int"
        " - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')",
        mysql="SELECT @@max_connections - (SELECT count(*) FROM information_schema.PROCESSLIST)",
    )


def _server_count(url: str, postgresql: str, mysql: str) -> int | None:
    """One number the server reports, by the query for its kind (None: SQLite, no server)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            query = {"postgresql": postgresql, "mysql": mysql, "mariadb": mysql}.get(
                conn.dialect.name
            )
            if query is None:
                return None
            return int(conn.execute(sa.text(query)).scalar_one())
    finally:
        engine.dispose()

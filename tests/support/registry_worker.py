"""A ``dbqueue worker`` process on support/registry_app.py's tasks, for the registry, metrics
and tracing tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
QUEUE = "reg"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(backend, log: Path, port: int | None, env_extra: dict | None = None):
    command = [str(Path(sys.executable).parent / "dbqueue"), "worker", "--url", backend.url]
    command += ["--table-prefix", backend.prefix, "--strategy", backend.strategy]
    command += ["--server", backend.server] if backend.server else []
    command += ["--app", "support.registry_app:app", "--queue", QUEUE, "--concurrency", "2"]
    command += ["--heartbeat-interval", "0.3", "--poll-interval", "0.1", "--no-maintenance"]
    command += ["--batch-size", "1"]  # a claim holds exactly the jobs that run
    if port is not None:
        command += ["--metrics-port", str(port), "--metrics-bind", "127.0.0.1"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "QUEUE_BASE_INTERVAL_RETRY": "0.001",  # minutes: the flaky job's retry is due at once
        **(env_extra or {}),
    }
    env.pop("DBQUEUE_URL", None)
    return subprocess.Popen(command, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env)


def register_worker(app, name: str, jobs: list[dict], queues: list[str]) -> None:
    """A live worker's registry row written by hand (for ten minutes), listing ``jobs``."""
    values = {
        "id": name,
        "name": name,
        "host": "elsewhere",
        "pid": 1,
        "queues": queues,
        "concurrency": 1,
        "strategy": "any",
        "running": len(jobs),
        "jobs": jobs,
        "processed": 0,
        "failed": 0,
    }
    with app.engine.begin() as conn, app.context.workers_connection(conn) as registry:
        app.queue_engine(registry).workers.register_worker(registry, values, 600)


def set_job_row(app, job_id: int, **values) -> None:
    """Write columns of a job's row by hand: what a worker's claim or outcome would leave."""
    jobs = app.tables.jobs
    with app.engine.begin() as conn:
        conn.execute(jobs.update().where(jobs.c.id == job_id).values(**values))

"""A worker process for the multi-process tests (concurrency, crashes, signals).

    python tests/support/worker_process.py URL STRATEGY [--concurrency N] [--burst] ...

Its task ``effect`` inserts a row keyed by the job id into the effects table, in the job's
transaction, so that a job run twice (duplicate key) or lost (missing row) shows in the table.
The payload may ask the handler to touch a file (to tell the test it started), then sleep, or
wait until another file exists (the test says when it may finish).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dbqueue  # noqa: E402
from support.backends import PREFIX, effects  # noqa: E402


def build_app(
    url: str,
    sleep: bool = True,
    prefix: str = PREFIX,
    server: str | None = None,
    async_handlers: bool = False,
    async_slots: bool = False,
) -> dbqueue.App:
    """``async_slots``: ``effect`` stays a plain handler, run on an async slot's own thread
    (an async task is registered too, so the worker runs slots on an event loop)."""
    app = dbqueue.App(url, table_prefix=prefix, retry_base_interval=0.05, lock_server=server)
    if async_handlers:
        app.task("effect")(async_effect(sleep))
        return app
    if async_slots:
        app.task("async_noop")(async_noop)

    @app.task("effect")
    def effect(job: dbqueue.Job, session) -> str:
        payload = job.payload or {}
        note = f"attempt {job.attempt}"
        if payload.get("wait_before_write"):  # SQLite: no write lock while it waits
            write_pid(Path(payload["started_file"]))
            wait_until(Path(payload["wait_before_write"]))
        session.execute(effects.insert().values(job_id=job.id, note=note, pid=os.getpid()))
        session.flush()
        if sleep and payload.get("started_file"):
            write_pid(Path(payload["started_file"]))
        if sleep and payload.get("sleep"):
            time.sleep(float(payload["sleep"]))
        if payload.get("wait_file"):
            wait_until(Path(payload["wait_file"]))
        return f"done by {os.getpid()}"

    return app


def write_pid(path: Path) -> None:
    """Written whole or not at all (a rename): a test that sees the file may SIGKILL us at once."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(str(os.getpid()))
    os.replace(partial, path)


def wait_until(path: Path) -> None:
    deadline = time.monotonic() + 300
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


async def async_noop(job: dbqueue.Job, session) -> None:
    return None


def async_effect(sleep: bool):
    """``effect`` as an ``async def``: the same row through its AsyncSession, awaited sleeps."""

    async def effect(job: dbqueue.Job, session) -> str:
        payload = job.payload or {}
        note = f"attempt {job.attempt}"
        await session.execute(effects.insert().values(job_id=job.id, note=note, pid=os.getpid()))
        await session.flush()
        if sleep and payload.get("started_file"):
            write_pid(Path(payload["started_file"]))
        if sleep and payload.get("sleep"):
            await asyncio.sleep(float(payload["sleep"]))
        if payload.get("wait_file"):
            deadline = time.monotonic() + 300
            while not Path(payload["wait_file"]).exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        return f"done by {os.getpid()}"

    return effect


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("strategy")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--burst", action="store_true")
    parser.add_argument("--max-runtime", type=float)
    parser.add_argument("--poll-interval", type=float, default=0.05)
    parser.add_argument("--no-sleep", action="store_true", help="ignore the payload's sleep")
    parser.add_argument("--no-maintenance", action="store_true")
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--prefix", default=PREFIX, help="table prefix")
    parser.add_argument("--server", help="HOST:PORT of the lock server")
    parser.add_argument("--async-handlers", action="store_true", help="effect as an async def")
    parser.add_argument(
        "--async-slots", action="store_true", help="a plain effect, on an async worker's slot"
    )
    parser.add_argument("--shutdown-timeout", type=float)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format=f"%(asctime)s {os.getpid()} %(levelname)s %(name)s: %(message)s",
    )
    app = build_app(
        args.url, not args.no_sleep, args.prefix, args.server, args.async_handlers, args.async_slots
    )
    summary = app.run_worker(
        strategy=args.strategy,
        concurrency=args.concurrency,
        batch_size=args.batch_size,
        burst=args.burst,
        max_runtime=args.max_runtime,
        poll_interval=args.poll_interval,
        maintenance=not args.no_maintenance,
        shutdown_timeout=args.shutdown_timeout,
    )
    print(f"SUMMARY succeeded={summary.succeeded} failed={summary.failed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

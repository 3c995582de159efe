"""A worker process for the chaos suite.

    python tests/support/chaos_worker.py URL STRATEGY PREFIX [--server HOST:PORT]

Its task ``chaos`` inserts a row into ``<PREFIX>runs`` in the job's own transaction. That table has
no unique key on the job id, so a job whose run committed twice shows as two rows (the contract
suite's effects table would refuse the second with a duplicate key instead). The handler sleeps a
few milliseconds, so that the SIGKILLs and the restart find handlers mid-job. Keyed jobs also
record their key, their number in enqueue order and when the run started and ended. Maintenance
ticks every half second and rescue runs on each tick: a killed advisory-lock worker leaves jobs
``running`` that rescue must retry.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import random
import sys
import time
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dbqueue  # noqa: E402

runs_metadata = sa.MetaData()


@functools.cache
def runs_table(prefix: str) -> sa.Table:
    return sa.Table(
        f"{prefix}runs",
        runs_metadata,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("job_id", sa.BigInteger, nullable=False, index=True),
        sa.Column("pid", sa.Integer, nullable=False),
        # Keyed jobs: the key, the job's number in enqueue order, when the run started/ended.
        sa.Column("key", sa.String(50), nullable=True),
        sa.Column("n", sa.Integer, nullable=True),
        sa.Column("started", sa.Double, nullable=True),
        sa.Column("ended", sa.Double, nullable=True),
        mysql_engine="InnoDB",
    )


def build_app(url: str, prefix: str, async_handlers: bool = False) -> dbqueue.App:
    app = dbqueue.App(url, table_prefix=prefix, retry_base_interval=0.05)
    runs = runs_table(prefix)
    if async_handlers:

        @app.task("chaos")
        async def async_chaos(job: dbqueue.Job, session) -> None:
            started = time.time()
            await asyncio.sleep(random.uniform(0, 0.01))
            await session.execute(runs.insert().values(**run_row(job, started)))

        return app

    @app.task("chaos")
    def chaos(job: dbqueue.Job, session) -> None:
        started = time.time()
        time.sleep(random.uniform(0, 0.01))
        session.execute(runs.insert().values(**run_row(job, started)))

    return app


def run_row(job: dbqueue.Job, started: float) -> dict:
    """The run's row: keyed jobs record their key, number and times (order, no overlap)."""
    return {
        "job_id": job.id,
        "pid": os.getpid(),
        "key": job.key,
        "n": (job.payload or {}).get("n"),
        "started": started,
        "ended": time.time(),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("strategy")
    parser.add_argument("prefix")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--server", help="HOST:PORT of the lock server (lock_server)")
    parser.add_argument("--async-handlers", action="store_true", help="chaos as an async def")
    parser.add_argument(
        "--leased", action="store_true", help="run the jobs outside their claim's transaction"
    )
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {os.getpid()} %(levelname)s %(name)s: %(message)s",
    )
    app = build_app(args.url, args.prefix, args.async_handlers)
    app = app.reconfigured(
        maintenance_tick=0.5,
        rescue_minutes=tuple(range(60)),
        notify_minutes=tuple(range(60)),
        transaction=False if args.leased else None,
    )
    # Leased: a killed worker's jobs wait for their lease to end. Twenty heartbeats to a lease,
    # so that a loaded machine never loses one of a live worker.
    leases = {"heartbeat_interval": 0.25, "lease_seconds": 5.0} if args.leased else {}
    summary = app.run_worker(
        strategy=args.strategy,
        concurrency=args.concurrency,
        poll_interval=0.2,
        lock_server=args.server,
        **leases,
    )
    print(f"SUMMARY succeeded={summary.succeeded} failed={summary.failed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

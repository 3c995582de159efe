"""A worker process with one periodic schedule, for the exactly-once tests of periodic jobs.

    python tests/support/periodic_worker.py URL STRATEGY --name NAME --every SECONDS ...

The schedule enqueues task ``per_tick`` (a no-op) every SECONDS with catch_up="all". Logger
``dbqueue.periodic`` logs at DEBUG, each line with the process id, so that a test can see which
process enqueued which tick and that every process took part. With ``--wait-file PATH`` the
process imports everything, then starts its worker only once PATH exists: a replacement ready
to start the moment the test kills a worker, without seconds of imports in between.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import dbqueue

TASK = "per_tick"


def build_app(url: str, prefix: str, server: str | None, name: str, every: float) -> dbqueue.App:
    app = dbqueue.App(url, table_prefix=prefix, lock_server=server)

    @app.periodic(every=every, name=name, catch_up="all", payload={"from": "schedule"})
    @app.task(TASK)
    def tick(job: dbqueue.Job, session: dbqueue.JobSession) -> None:
        return None

    return app


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("strategy")
    parser.add_argument("--name", required=True, help="the schedule's name")
    parser.add_argument("--every", type=float, required=True)
    # Required rather than read from support.backends: importing that (and pytest with it)
    # would add a good part of a second to every start of this process.
    parser.add_argument("--prefix", required=True, help="table prefix")
    parser.add_argument("--server", help="HOST:PORT of the lock server")
    parser.add_argument("--wait-file", type=Path, help="start the worker once this file exists")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s pid={os.getpid()} %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("dbqueue.periodic").setLevel(logging.DEBUG)
    app = build_app(args.url, args.prefix, args.server, args.name, args.every)
    deadline = time.monotonic() + 300
    while args.wait_file and not args.wait_file.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    # Jobs do not matter here (local enqueues wake the worker anyway): poll seldom.
    app.run_worker(strategy=args.strategy, poll_interval=1.0, maintenance=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A worker process for the cancellation tests (tests/contract/test_cancel.py).

    python tests/support/cancel_worker.py URL STRATEGY [--prefix P] [--server HOST:PORT] ...

Each task first writes an effects row in the job's transaction (flushed, so it is in the
database, uncommitted) and touches ``<dir>/started-<id>``, then runs until cancelled:

- ``cooperative`` polls ``job.cancel_requested()`` and returns once it is true, after touching
  ``<dir>/saw-<id>``;
- ``stubborn`` ignores it, sleeping in small steps, and touches ``<dir>/interrupted-<id>`` when
  JobCancelledError reaches it (then lets it go on);
- ``blocked`` sleeps for minutes in one C call, where no exception can reach it.

Each has a dead handler that writes an effects row: it must never run for a cancelled job.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dbqueue  # noqa: E402
from support.backends import PREFIX, effects  # noqa: E402

RUN_FOR = 120.0


def build_app(url: str, prefix: str = PREFIX, server: str | None = None) -> dbqueue.App:
    app = dbqueue.App(url, table_prefix=prefix, retry_base_interval=0.05, lock_server=server)

    def begin(job: dbqueue.Job, session) -> Path:
        session.execute(effects.insert().values(job_id=job.id, note=job.task, pid=os.getpid()))
        session.flush()
        folder = Path(job.payload["dir"])
        (folder / f"started-{job.id}").touch()
        return folder

    def dead(job: dbqueue.Job, session) -> None:
        session.execute(effects.insert().values(job_id=job.id, note="dead handler"))

    @app.task("cooperative", dead_handler=dead)
    def cooperative(job: dbqueue.Job, session) -> str:
        folder = begin(job, session)
        deadline = time.monotonic() + RUN_FOR
        while time.monotonic() < deadline:
            if job.cancel_requested():
                (folder / f"saw-{job.id}").touch()
                return "stopped on request"
            time.sleep(0.02)
        return "never asked"

    @app.task("stubborn", dead_handler=dead)
    def stubborn(job: dbqueue.Job, session) -> str:
        folder = begin(job, session)
        try:
            deadline = time.monotonic() + RUN_FOR
            while time.monotonic() < deadline:
                time.sleep(0.05)
        except dbqueue.JobCancelledError:
            (folder / f"interrupted-{job.id}").touch()
            raise
        return "never interrupted"

    @app.task("blocked", dead_handler=dead)
    def blocked(job: dbqueue.Job, session) -> str:
        begin(job, session)
        time.sleep(RUN_FOR)
        return "never abandoned"

    return app


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("strategy")
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--timeout-grace", type=float, default=0.5)
    parser.add_argument("--cancel-notice", type=float, default=0.3)
    parser.add_argument("--prefix", default=PREFIX, help="table prefix")
    parser.add_argument("--server", help="HOST:PORT of the lock server")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {os.getpid()} %(levelname)s %(name)s: %(message)s",
    )
    app = build_app(args.url, args.prefix, args.server)
    summary = app.run_worker(
        strategy=args.strategy,
        concurrency=args.concurrency,
        poll_interval=0.05,
        timeout_grace=args.timeout_grace,
        cancel_notice=args.cancel_notice,
        maintenance=False,
    )
    print(
        f"SUMMARY succeeded={summary.succeeded} failed={summary.failed} "
        f"cancelled={summary.cancelled}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

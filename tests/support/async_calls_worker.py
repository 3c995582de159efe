"""A worker process for the asyncio calls' tests (tests/contract/test_async_results.py): the
cancellation worker's tasks (support/cancel_worker.py), and

- ``add``: returns the sum of the payload's ``a`` and ``b``;
- ``boom``: raises, with the payload's ``why``;
- ``wait_file``: touches ``started``, waits until ``wait_file`` exists, returns ``"released"``.

    python tests/support/async_calls_worker.py URL STRATEGY [--prefix P] [--server HOST:PORT]
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
from support.backends import PREFIX  # noqa: E402
from support.cancel_worker import build_app as cancel_app  # noqa: E402

WAIT_AT_MOST = 300.0


def build_app(url: str, prefix: str = PREFIX, server: str | None = None) -> dbqueue.App:
    app = cancel_app(url, prefix, server)

    @app.task(max_attempts=1)
    def add(job: dbqueue.Job, session) -> dict:
        return {"sum": job.payload["a"] + job.payload["b"], "by": os.getpid()}

    @app.task(max_attempts=1)
    def boom(job: dbqueue.Job, session) -> None:
        raise RuntimeError(job.payload["why"])

    @app.task
    def wait_file(job: dbqueue.Job, session) -> str:
        Path(job.payload["started"]).touch()
        deadline = time.monotonic() + WAIT_AT_MOST
        while not Path(job.payload["wait_file"]).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return "released"

    return app


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("strategy")
    parser.add_argument("--prefix", default=PREFIX, help="table prefix")
    parser.add_argument("--server", help="HOST:PORT of the lock server")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {os.getpid()} %(levelname)s %(name)s: %(message)s",
    )
    build_app(args.url, args.prefix, args.server).run_worker(
        strategy=args.strategy,
        concurrency=3,
        poll_interval=0.05,
        timeout_grace=0.5,
        cancel_notice=0.3,
        maintenance=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

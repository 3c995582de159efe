"""A worker process whose tasks return a result or fail — for the ``app.call`` test whose
caller runs in the test process. It polls once an hour: only pushes wake it.

    python tests/support/results_worker.py URL STRATEGY [--prefix P] [--server HOST:PORT]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dbqueue  # noqa: E402
from support.backends import PREFIX  # noqa: E402


def build_app(url: str, prefix: str = PREFIX, server: str | None = None) -> dbqueue.App:
    app = dbqueue.App(url, table_prefix=prefix, retry_base_interval=0.05, lock_server=server)

    @app.task("add")
    def add(job: dbqueue.Job, session) -> dict:
        a, b = job.payload["a"], job.payload["b"]
        return {"sum": a + b, "by": os.getpid(), "echo": job.payload}

    @app.task("boom")
    def boom(job: dbqueue.Job, session) -> None:
        raise RuntimeError(job.payload["why"])

    return app


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("strategy")
    parser.add_argument("--prefix", default=PREFIX)
    parser.add_argument("--server")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {os.getpid()} %(levelname)s %(name)s: %(message)s"
    )
    app = build_app(args.url, args.prefix, args.server)
    # Polls once an hour: a job done in a test's time was reached by a push.
    app.run_worker(
        strategy=args.strategy,
        poll_interval=3600,
        min_poll_interval=3600,
        maintenance=False,
        concurrency=2,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

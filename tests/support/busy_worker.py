"""A worker process that polls once an hour, for the tests of due times while threads are busy.

    python tests/support/busy_worker.py URL STRATEGY [--concurrency N] [--async-slots] ...

Its tasks, each told by its payload which files to touch or wait for:

- ``long``: says it started (a file), then blocks until the test releases it (another file),
  then writes its row: a long job holding a thread;
- ``flaky``: its first attempt says it started, waits for the test's go, and fails — with
  ``Retry(in_seconds=…)`` (``"retry"``) or by raising (``"backoff"``: the task's backoff);
  its next attempt writes its row;
- ``delayer``: enqueues a ``later`` job due in ``delay`` seconds, in its own transaction;
- ``dies_once``: raises on its first run (one attempt allowed: it dies), writes its row once
  the test requeued it;
- ``later``: writes its row.

With ``--async-slots`` one more task is an ``async def``, so that the worker's slots run on an
event loop (their idle waits are awaited) while the tasks above run as plain handlers.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dbqueue  # noqa: E402
from support.backends import PREFIX, effects  # noqa: E402
from support.worker_process import wait_until, write_pid  # noqa: E402

HOUR = 3600.0
#: Seconds before a failed attempt of ``flaky`` runs again, either way it fails.
RETRY_IN = 1.0


def build_app(url: str, prefix: str = PREFIX, server: str | None = None) -> dbqueue.App:
    app = dbqueue.App(url, table_prefix=prefix, lock_server=server)

    def write(session, job: dbqueue.Job, note: str) -> None:
        session.execute(effects.insert().values(job_id=job.id, note=note, pid=os.getpid()))

    @app.task("long")
    def long(job: dbqueue.Job, session) -> None:
        write_pid(Path(job.payload["started"]))
        wait_until(Path(job.payload["release"]))
        write(session, job, "long")

    @app.task("flaky", retry_base_interval=RETRY_IN)
    def flaky(job: dbqueue.Job, session) -> None:
        if job.attempt == 1:
            write_pid(Path(job.payload["started"]))
            wait_until(Path(job.payload["go"]))
            if job.payload["kind"] == "retry":
                raise dbqueue.Retry("not yet", in_seconds=RETRY_IN)
            raise RuntimeError("not yet")
        write(session, job, f"attempt {job.attempt}")

    @app.task("delayer")
    def delayer(job: dbqueue.Job, session) -> None:
        app.enqueue(session, "later", {}, delay=job.payload["delay"])

    @app.task("dies_once", max_attempts=1)
    def dies_once(job: dbqueue.Job, session) -> None:
        if job.previous_status != "dead":
            raise RuntimeError("dead on the first run")
        write(session, job, "requeued")

    @app.task("later")
    def later(job: dbqueue.Job, session) -> None:
        write(session, job, "later")

    return app


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("strategy")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--prefix", default=PREFIX, help="table prefix")
    parser.add_argument("--server", help="HOST:PORT of the lock server")
    parser.add_argument("--async-slots", action="store_true", help="slots on an event loop")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {os.getpid()} %(levelname)s %(name)s: %(message)s"
    )
    app = build_app(args.url, args.prefix, args.server)
    if args.async_slots:

        @app.task("async_noop")
        async def async_noop(job: dbqueue.Job, session) -> None:
            return None

    summary = app.run_worker(
        strategy=args.strategy,
        concurrency=args.concurrency,
        batch_size=1,
        poll_interval=HOUR,
        min_poll_interval=HOUR,
        maintenance=False,
        periodic=False,
    )
    print(f"SUMMARY succeeded={summary.succeeded} failed={summary.failed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

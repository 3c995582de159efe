"""A dbqueue worker process for the benchmarks: no-op handler, counts, resident memory.

    python -m benchmarks.worker_proc URL [--prefix bench_] [--concurrency 4] [--batch-size 10]
        [--strategy NAME] [--burst] [--sample-rss-every N] [--log-format text|json] [--log-jobs]
        [--queue-limit QUEUE=N] [--metrics] [--option heartbeat_interval=5.0]

On exit (burst drained, or SIGTERM) it prints one JSON line: seconds spent in run_worker, jobs
succeeded, statements and commits it sent (counted by SQLAlchemy events), and resident memory
(VmRSS) at start, after warm-up and at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from typing import Any

import sqlalchemy as sa

import dbqueue
from dbqueue import logs
from dbqueue.limits import parse_queue_limits


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statements = 0
        self.commits = 0

    def install(self) -> None:
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", self._statement)
        sa.event.listen(sa.engine.Engine, "commit", self._commit)

    def _statement(self, *args: Any) -> None:
        with self.lock:
            self.statements += 1

    def _commit(self, *args: Any) -> None:
        with self.lock:
            self.commits += 1


def measure_window(
    worker: dbqueue.Worker, counters: Counters, warmup: float, seconds: float, out: dict
) -> None:
    """Count what the worker sends over ``seconds`` after ``warmup``, then stop it."""
    time.sleep(warmup)
    before = (counters.statements, counters.commits)
    time.sleep(seconds)
    out.update(
        seconds=seconds,
        statements=counters.statements - before[0],
        commits=counters.commits - before[1],
    )
    worker.stop()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--prefix", default="bench_")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--strategy")
    parser.add_argument("--lock-server", help="HOST:PORT of dbqueue server (lock_server)")
    parser.add_argument("--burst", action="store_true")
    parser.add_argument("--count", action="store_true", help="count statements and commits")
    parser.add_argument("--sample-rss-every", type=int, default=0)
    parser.add_argument("--option", action="append", default=[], help="extra worker option k=v")
    parser.add_argument("--log-format", choices=logs.LOG_FORMATS, help="log at INFO to stderr")
    parser.add_argument("--log-jobs", action="store_true", help="one log line per job")
    parser.add_argument("--metrics", action="store_true", help="Prometheus counters (in memory)")
    parser.add_argument("--queue-limit", action="append", default=[], help="QUEUE=N")
    parser.add_argument(
        "--idle-window",
        help="WARMUP,SECONDS: count statements and commits over SECONDS after WARMUP, then stop",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.log_format:
        logging.basicConfig(
            level=logging.INFO, handlers=[logs.handler(args.log_format, sys.stderr)]
        )

    app = dbqueue.App(args.url, table_prefix=args.prefix, lock_server=args.lock_server)
    samples: list[tuple[int, int]] = []
    done = [0]

    @app.task("noop")
    def noop(job: dbqueue.Job, session: Any) -> None:
        if args.sample_rss_every:
            done[0] += 1
            if done[0] % args.sample_rss_every == 0:
                samples.append((done[0], rss_kib()))

    if args.metrics:
        from dbqueue import metrics

        metrics.instrument(app)
    counters = Counters()
    if args.count or args.idle_window:
        counters.install()
    extra = {}
    for item in args.option:
        key, _, value = item.partition("=")
        extra[key] = float(value) if "." in value else int(value)
    worker = app.worker(
        concurrency=args.concurrency,
        batch_size=args.batch_size,
        strategy=args.strategy,
        burst=args.burst,
        maintenance=not args.burst,
        log_jobs=args.log_jobs,
        queue_limits=parse_queue_limits(args.queue_limit),
        **extra,
    )
    window: dict[str, float] = {}
    if args.idle_window:
        warmup, seconds = (float(x) for x in args.idle_window.split(","))
        threading.Thread(
            target=measure_window, args=(worker, counters, warmup, seconds, window), daemon=True
        ).start()
    rss_start = rss_kib()
    started = time.perf_counter()
    summary = worker.run()
    seconds = time.perf_counter() - started
    print(
        json.dumps(
            {
                "seconds": seconds,
                "succeeded": summary.succeeded,
                "failed": summary.failed,
                "statements": counters.statements,
                "commits": counters.commits,
                "rss_start_kib": rss_start,
                "rss_end_kib": rss_kib(),
                "rss_samples": samples,
                "window": window,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()

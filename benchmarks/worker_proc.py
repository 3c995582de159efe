"""A dbqueue worker process for the benchmarks: no-op handler, counts, resident memory.

    python -m benchmarks.worker_proc URL [--prefix bench_] [--concurrency 4] [--batch-size 10]
        [--strategy NAME] [--burst] [--sample-rss-every N] [--log-format text|json] [--log-jobs]
        [--queue-limit QUEUE=N] [--async-handlers] [--metrics]
        [--option heartbeat_interval=5.0] [--barrier DIR]

On exit (burst drained, or SIGTERM) it prints one JSON line: seconds spent in run_worker, jobs
succeeded, statements and commits it sent (counted by SQLAlchemy events), and resident memory
(VmRSS) at start, after warm-up and at the end, and when run_worker started and ended (epoch
seconds: a fleet's processes are measured over one window).

``--barrier DIR``: once set up, write ``DIR/ready-<pid>`` and wait for ``DIR/go`` before running
the worker, so that several processes start together whatever their import times.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from typing import Any

import sqlalchemy as sa

import dbqueue
from dbqueue.base.limits import parse_queue_limits
from dbqueue.cli import logs


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


def wait_at_barrier(directory: str) -> None:
    """Say this process is ready, then wait for the go (a fleet starts at one moment)."""
    ready = os.path.join(directory, f"ready-{os.getpid()}")
    with open(ready + ".tmp", "w") as marker:
        marker.write("ready")
    os.rename(ready + ".tmp", ready)
    go = os.path.join(directory, "go")
    while not os.path.exists(go):
        time.sleep(0.01)


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
    parser.add_argument("--async-handlers", action="store_true", help="noop as an async def")
    parser.add_argument(
        "--idle-window",
        help="WARMUP,SECONDS: count statements and commits over SECONDS after WARMUP, then stop",
    )
    parser.add_argument("--barrier", help="DIR: wait for DIR/go before running (see above)")
    return parser.parse_args()


def build_worker(args: argparse.Namespace, samples: list[tuple[int, int]]) -> dbqueue.Worker:
    """An App with the no-op task (sampling RSS if asked) and its worker, as the options say."""
    app = dbqueue.App(args.url, table_prefix=args.prefix, lock_server=args.lock_server)
    done = [0]

    def noop(job: dbqueue.Job, session: Any) -> None:
        if args.sample_rss_every:
            done[0] += 1
            if done[0] % args.sample_rss_every == 0:
                samples.append((done[0], rss_kib()))

    async def async_noop(job: dbqueue.Job, session: Any) -> None:
        noop(job, session)

    app.task("noop")(async_noop if args.async_handlers else noop)

    if args.metrics:
        from dbqueue.observability import metrics

        metrics.instrument(app)
    extra = {}
    for item in args.option:
        key, _, value = item.partition("=")
        extra[key] = float(value) if "." in value else int(value)
    return app.worker(
        concurrency=args.concurrency,
        batch_size=args.batch_size,
        strategy=args.strategy,
        burst=args.burst,
        maintenance=not args.burst,
        log_jobs=args.log_jobs,
        queue_limits=parse_queue_limits(args.queue_limit),
        **extra,
    )


def main() -> None:
    args = parse_args()
    if args.log_format:
        logging.basicConfig(
            level=logging.INFO, handlers=[logs.handler(args.log_format, sys.stderr)]
        )
    samples: list[tuple[int, int]] = []
    worker = build_worker(args, samples)
    counters = Counters()
    if args.count or args.idle_window:
        counters.install()
    window: dict[str, float] = {}
    if args.barrier:
        wait_at_barrier(args.barrier)
    if args.idle_window:
        warmup, seconds = (float(x) for x in args.idle_window.split(","))
        threading.Thread(
            target=measure_window, args=(worker, counters, warmup, seconds, window), daemon=True
        ).start()
    rss_start = rss_kib()
    started_at = time.time()
    started = time.perf_counter()
    cpu_started = time.process_time()
    summary = worker.run()
    seconds = time.perf_counter() - started
    print(
        json.dumps(
            {
                "seconds": seconds,
                "started_at": started_at,
                "ended_at": time.time(),
                "succeeded": summary.succeeded,
                "failed": summary.failed,
                "rounds": summary.rounds,
                "reconnects": summary.reconnects,
                "cpu_seconds": time.process_time() - cpu_started,
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

"""How late retries and delayed jobs start while some of a worker's threads run long jobs.

    python -m benchmarks.retry_lateness postgresql|mariadb|sqlite [--samples 4] [--busy 0 2 3]
        [--poller-busy]

A worker (4 threads, the database's default poll interval, in this process) first gets
``busy`` long jobs, which block until the end of the run. Then, one at a time, a job fails
with ``Retry(in_seconds=2)``, and a job enqueues another for 2 s later; the lateness is the
time from when the job was due (the failure's or the enqueue's moment plus 2 s, this
machine's clock) to its handler's start. The jobs are enqueued through another App, as a web
process would: only a push or a poll tells the worker of them, not an in-process wake-up.
With ``--poller-busy`` the thread that was left polling is among the busy ones: every thread
starts with a long job, one ends (its thread idles, polling for all), a new long job goes to
that thread, another ends. Figures are printed, not asserted (run it against another checkout
with PYTHONPATH to compare).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import threading
import time

import dbqueue
from benchmarks.common import URLS, fresh_app

PREFIX = "bench_late_"
CONCURRENCY = 4
DUE_IN = 2.0
#: How long a thread whose long job ended is given to go idle.
SETTLE = 0.5
#: The longest wait for one sample: past it the sample counts as this late.
GIVE_UP = 45.0


class Scenario:
    """The worker, its long jobs, and the times its handlers note."""

    def __init__(self, url: str, busy: int, poller_busy: bool = False) -> None:
        self.app = fresh_app(url, prefix=PREFIX)
        #: Where the jobs are enqueued: another App, whose enqueues wake no worker in-process.
        self.client = dbqueue.App(url, table_prefix=PREFIX)
        self.release = threading.Event()
        #: A long job ends when its gate opens, or at the end of the run.
        self.gates: collections.defaultdict[int, threading.Event] = collections.defaultdict(
            threading.Event
        )
        self.started: dict[int, float] = {}  # job id -> when its handler (re)started
        self.due: dict[int, float] = {}  # job id -> when it fell due
        self.long_started = threading.Semaphore(0)
        self._register()
        self.worker = self.app.worker(
            concurrency=CONCURRENCY, install_signal_handlers=False, maintenance=False
        )
        self.thread = threading.Thread(target=self.worker.run, daemon=True)
        if not poller_busy:
            self.thread.start()
            self.wait_started(self.enqueue_long_jobs(busy))
            return
        assert busy == CONCURRENCY - 1, "--poller-busy leaves one thread idle"
        first = self.enqueue_long_jobs(CONCURRENCY)  # one per thread, from the start
        self.thread.start()
        self.wait_started(first)
        self.gates[first[0]].set()  # its thread idles: it polls for all
        time.sleep(SETTLE)
        self.wait_started(self.enqueue_long_jobs(1))  # goes to that thread, the only idle one
        self.gates[first[1]].set()  # this one idles now
        time.sleep(SETTLE)

    def enqueue_long_jobs(self, count: int) -> list[int]:
        return [self.client.enqueue(None, "long", {}) for _ in range(count)]

    def wait_started(self, ids: list[int]) -> None:
        for _ in ids:
            self.long_started.acquire(timeout=GIVE_UP)

    def _register(self) -> None:
        app = self.app

        @app.task("long")
        def long(job, session):
            self.long_started.release()
            gate = self.gates[job.id]
            while not (gate.is_set() or self.release.is_set()):
                gate.wait(0.05)

        @app.task("flaky")
        def flaky(job, session):
            if job.attempt == 1:
                self.due[job.id] = time.time() + DUE_IN
                raise dbqueue.Retry("later", in_seconds=DUE_IN)
            self.started[job.id] = time.time()

        @app.task("delayer")
        def delayer(job, session):
            later = app.enqueue(session, "later", {}, delay=DUE_IN)
            self.due[later] = time.time() + DUE_IN

        @app.task("later")
        def later(job, session):
            self.started[job.id] = time.time()

    def lateness(self, task: str) -> float:
        """One sample: enqueue ``task``; seconds from its (or its follow-up's) due time to the
        start of the run that was due."""
        known = set(self.started)
        self.client.enqueue(None, task, {})
        deadline = time.monotonic() + GIVE_UP + DUE_IN
        while time.monotonic() < deadline:
            new = set(self.started) - known
            if new:
                job_id = new.pop()
                return self.started[job_id] - self.due[job_id]
            time.sleep(0.005)
        return GIVE_UP

    def close(self) -> None:
        self.release.set()
        self.worker.stop()
        self.thread.join(60)
        self.app.engine.dispose()
        self.client.engine.dispose()


def describe(samples: list[float]) -> str:
    ms = sorted(round(s * 1000) for s in samples)
    return f"median {statistics.median(ms):.0f} ms, max {max(ms)} ms (all: {ms})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("database", choices=sorted(URLS))
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2, 3])
    parser.add_argument("--poller-busy", action="store_true")
    args = parser.parse_args()
    for busy in [CONCURRENCY - 1] if args.poller_busy else args.busy:
        scenario = Scenario(URLS[args.database], busy, args.poller_busy)
        try:
            for task, what in (("flaky", "retry"), ("delayer", "delayed job")):
                samples = [scenario.lateness(task) for _ in range(args.samples)]
                among = " (the poller among them)" if args.poller_busy else ""
                print(
                    f"{args.database}: {busy} of {CONCURRENCY} threads busy{among}, {what} late by "
                    f"{describe(samples)}",
                    flush=True,
                )
        finally:
            scenario.close()


if __name__ == "__main__":
    main()

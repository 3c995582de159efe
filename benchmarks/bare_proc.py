"""The ceiling's drain as one process of a fleet: bare SQL, no dbqueue.

    python -m benchmarks.bare_proc URL --table NAME [--concurrency 4] [--batch-size 10]
        --barrier DIR

Runs ``benchmarks.ceiling.drain`` (threads claiming and completing batches through the raw
driver) once released, and prints one JSON line with the keys ``benchmarks.worker_proc``
reports, so that ``benchmarks.scaleout`` measures a bare fleet as it measures dbqueue's.
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks import ceiling
from benchmarks.worker_proc import wait_at_barrier


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--table", required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--barrier", required=True, help="DIR: wait for DIR/go before running")
    args = parser.parse_args()
    wait_at_barrier(args.barrier)
    started_at = time.time()
    cpu_started = time.process_time()
    jobs, seconds, transactions = ceiling.drain_counted(
        args.url, args.table, args.concurrency, args.batch_size
    )
    print(
        json.dumps(
            {
                "seconds": seconds,
                "started_at": started_at,
                "ended_at": time.time(),
                "succeeded": jobs,
                "rounds": transactions,
                "cpu_seconds": time.process_time() - cpu_started,
                "commits": transactions,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()

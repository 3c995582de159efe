"""One claim and the run of what it got, in the transactions the strategy's kind of claim needs:
the worker's loop claims from a queue, eager mode claims given jobs by id, the rest is this."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.engine import Connection

from dbqueue.engine import QueueEngine
from dbqueue.job import Job
from dbqueue.worker.executor import BatchExecutor, BatchResult
from dbqueue.worker.watchdog import Abandoned

log = logging.getLogger("dbqueue.worker")


def claim_and_run(
    executor: BatchExecutor,
    conn: Connection,
    engine: QueueEngine,
    claim: Callable[[], list[Job]],
    should_stop: Callable[[], bool],
) -> BatchResult | None:
    """Claim with ``claim`` (a call of the executor's strategy) and run the jobs; None when it
    got nothing. An in-transaction claim runs and commits in one transaction; a committed
    claim's jobs are given back, and their locks released, if running them fails."""
    strategy = executor.strategy
    if strategy.claims_in_transaction:
        with conn.begin():
            jobs = claim()
            if not jobs:
                return None
            done = executor.execute(conn, engine, jobs, should_stop)
        executor.after_commit()
        return done
    jobs = claim()  # commits 'running'
    if not jobs:
        return None
    try:
        result = executor.execute_committed(conn, engine, jobs, should_stop)
    except Abandoned:
        raise  # the watchdog recorded the outcome; this thread writes nothing more
    except BaseException:
        executor.give_back(conn, engine, jobs)
        try:
            strategy.release(conn, engine.claims, jobs)
        except Exception:  # the original error says more; rescue frees what is left
            log.debug("releasing the locks of a failed batch failed", exc_info=True)
        raise
    strategy.release(conn, engine.claims, jobs, jobs_released=result.released)
    return result

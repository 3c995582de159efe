"""Batch tasks (``@app.batch_task``): which claimed jobs one handler call gets, and the
gathering of more jobs of such a task once a claim got some.

A claim takes jobs in claim order whatever their task. Jobs of a batch task among them are
grouped per task, and the group is topped up with the strategy's ``claim_task`` — the same kind
of claim, narrowed to that task — up to ``max_size``, looking again for at most ``max_wait``
seconds after the claim. The jobs are held meanwhile (row locks in the open transaction, or
named locks on jobs committed ``running``), so a worker killed while it waits loses nothing: its
claims go the way of any other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dbqueue.job import Job
from dbqueue.tasks.registry import BatchOptions, TaskRegistry

if TYPE_CHECKING:
    from dbqueue.engine import QueueEngine
    from dbqueue.strategies import ClaimStrategy

log = logging.getLogger("dbqueue.worker")

#: The first pause between two looks for more jobs of a batch task; it doubles up to the last.
FIRST_PAUSE = 0.02
LAST_PAUSE = 0.25


def units(registry: TaskRegistry, jobs: list[Job]) -> list[list[Job]]:
    """The handler calls a claim's jobs make, in claim order: one per job, except that the jobs
    of one batch task share one call (at the place of the first)."""
    if not registry.has_batches:
        return [[job] for job in jobs]
    found: list[list[Job]] = []
    batches: dict[str, list[Job]] = {}
    for job in jobs:
        if registry.batch_of(job) is None:
            found.append([job])
        elif job.task in batches:
            batches[job.task].append(job)
        else:
            batches[job.task] = [job]
            found.append(batches[job.task])
    return found


def gather(
    strategy: ClaimStrategy,
    registry: TaskRegistry,
    conn: Any,
    engine: QueueEngine,
    queue: str,
    jobs: list[Job],
    worker_id: str,
    *,
    reserve: Callable[[int], int],
    stopping: Callable[[], bool],
    pause: Callable[[float], Any] = time.sleep,
) -> list[Job]:
    """``jobs`` (a claim of ``queue``) with more jobs of each batch task among them, claimed
    until each has ``max_size`` or its ``max_wait`` is over (or the worker stops). ``reserve(n)``
    grants up to n more jobs of the worker's budget (``max_jobs``)."""
    if not registry.has_batches:
        return jobs
    wanted: dict[str, BatchOptions] = {}
    for job in jobs:
        options = registry.batch_of(job)
        if options is not None:
            wanted[job.task] = options
    if not wanted:
        return jobs
    started, wait = time.monotonic(), FIRST_PAUSE
    while True:
        for task, options in wanted.items():
            missing = options.max_size - sum(1 for job in jobs if job.task == task)
            granted = reserve(missing) if missing > 0 else 0
            if granted:
                try:
                    jobs += strategy.claim_task(
                        conn, engine.claims, queue, task, granted, worker_id, jobs
                    )
                except Exception:
                    if strategy.claims_in_transaction:
                        raise  # the transaction is spoilt: the claim rolls back whole
                    log.warning("gathering jobs of batch task %s failed", task, exc_info=True)
                    return jobs  # run those claimed (and committed) so far
        elapsed = time.monotonic() - started
        short = [
            options.max_wait - elapsed
            for task, options in wanted.items()
            if options.max_wait > elapsed
            and sum(1 for job in jobs if job.task == task) < options.max_size
        ]
        if not short or not strategy.waits_holding_claims or stopping():
            return jobs
        pause(min(wait, max(short)))
        wait = min(wait * 2, LAST_PAUSE)

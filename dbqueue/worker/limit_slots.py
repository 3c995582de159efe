"""A worker's start-up for its limited queues: their slot rows, and what each limit is."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dbqueue import dialects
from dbqueue.runtime.context import RuntimeContext

log = logging.getLogger("dbqueue.worker")


def prepare_slots(context: RuntimeContext, engine: Engine, limits: Mapping[str, int]) -> None:
    """Create the limited queues' slot rows that do not exist yet, and say what each limit is.

    Workers may be started with different limits for one queue: the rows are the union, and
    each worker uses only the slots numbered below its own limit, so the largest limit in use
    is the queue's limit across all workers (the warning below says so)."""
    for queue, limit in limits.items():
        count = _ensure_slots(context, engine, queue, limit)
        if count > limit:
            log.warning(
                "queue %s has %d slots, more than this worker's limit of %d: a worker was "
                "started with a higher limit, now or before. This worker uses slots 0-%d only, "
                "one with the higher limit uses them all: give every worker the same limit "
                "(and once none runs with the higher one, DELETE FROM %s WHERE queue = '%s' "
                "AND slot >= %d)",
                queue,
                count,
                limit,
                limit - 1,
                context.names.slots,
                queue,
                limit,
            )
        log.info("queue %s: at most %d job(s) at once across all workers", queue, limit)


def _ensure_slots(context: RuntimeContext, engine: Engine, queue: str, limit: int) -> int:
    """How many slots ``queue`` has, after creating those below ``limit`` that were missing.
    Read first without write intent: on SQLite a write would wait for the database's write
    lock, which a running job may hold for as long as it runs."""
    with engine.connect() as conn:
        reader = conn.execution_options(**{dialects.WRITE_INTENT: False})
        with reader.begin():
            have = context.queue_engine(reader).slots.slot_numbers(reader, queue)
    if set(range(limit)) <= have:
        return len(have)
    failures = 0
    while True:
        try:
            with engine.begin() as conn:
                return context.queue_engine(conn).slots.ensure_slots(conn, queue, limit)
        except sa.exc.IntegrityError:  # another worker created some of them meanwhile
            failures += 1
            if failures == 3:
                raise

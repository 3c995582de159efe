"""The job lifecycle in SQLAlchemy Core: insert, claim query, complete, fail, dead-letter, cancel,
admin.

One QueueEngine serves one set of queue tables on one database. Every statement it builds is the
same on every database; what differs (the clock, column types) comes from the Dialect, and how a
claim is made exclusive comes from the strategy, which calls ``runnable()``. Nothing here tests a
database's name.

The engine is one interface made of small parts, each a class on the shared EngineBase (tables,
dialect, statement cache): inserts, claims, outcomes, queries, housekeeping, cancels,
periodic ticks, queue-limit slots, unique keys, the workers registry. They are combined by
inheritance rather than delegation so that a hot-path call costs what it did in one class.
"""

from __future__ import annotations

from dbqueue.engine.cancels import CancelRequestRows, Cancels
from dbqueue.engine.claims import Claims
from dbqueue.engine.housekeeping import Housekeeping
from dbqueue.engine.limit_slots import Slots
from dbqueue.engine.outcomes import Outcomes
from dbqueue.engine.periodic_ticks import PeriodicTicks
from dbqueue.engine.queries import Queries
from dbqueue.engine.records import ALWAYS, FailResult, NewJob, QueueStats, truncate
from dbqueue.engine.unique import COALESCE, ON_CONFLICT
from dbqueue.engine.worker_rows import WorkerRows

__all__ = [
    "ALWAYS",
    "COALESCE",
    "ON_CONFLICT",
    "CancelRequestRows",
    "FailResult",
    "NewJob",
    "QueueEngine",
    "QueueStats",
    "truncate",
]


class QueueEngine(
    Outcomes, Claims, Queries, Housekeeping, Cancels, PeriodicTicks, Slots, WorkerRows
):
    """Every job-lifecycle statement on one set of queue tables of one database."""

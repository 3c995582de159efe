"""Internal: the job lifecycle in SQLAlchemy Core, on one set of queue tables of one database.

``QueueEngine`` is a few parts with one job each, composed here; every statement they run is
named once in ``catalog.py``, and ``Statements`` (``statements.py``) builds and compiles each
one once. What differs per database comes from the Dialect; how a claim is made exclusive comes
from the strategy, which receives ``claims`` and locks its statements its own way. Nothing here
tests a database's name.

    claims       what strategies lock and mark; claimed rows into Jobs        claims.py
    outcomes     complete, fail (retry or dead, dead-letter job)              outcomes.py
    inserts      one job, many jobs, a publication's record                   inserts.py
    keys         jobs sharing a key: their line, its head, the promotion      keys.py
    unique       unique keys at enqueue, and their release                    unique.py
    cancels      cancel waiting jobs, record a stopped one; request stores    cancels.py
    queries      reads: a job, equivalents, stats, states, due times          queries.py
    morgue       dead jobs: list, requeue, delete                             morgue.py
    periodic     the periodic ticks table                                     periodic_ticks.py
    slots        queue-limit slots' rows                                      limit_slots.py
    workers      the registry of live workers                                 worker_rows.py
    housekeeping purge and the maintenance ticks                              housekeeping.py
"""

from __future__ import annotations

from dbqueue.dialects import Dialect
from dbqueue.engine.cancels import CancelRequestRows, Cancels
from dbqueue.engine.claims import Claims
from dbqueue.engine.housekeeping import Housekeeping
from dbqueue.engine.inserts import Inserts
from dbqueue.engine.instruments import Instruments
from dbqueue.engine.keys import KeyLines
from dbqueue.engine.limit_slots import LimitSlots
from dbqueue.engine.morgue import Morgue
from dbqueue.engine.outcomes import Outcomes
from dbqueue.engine.periodic_ticks import PeriodicTicks
from dbqueue.engine.queries import Queries
from dbqueue.engine.records import ALWAYS, FailResult, NewJob, QueueStats, truncate
from dbqueue.engine.statements import Statements
from dbqueue.engine.unique import COALESCE, ON_CONFLICT, UniqueKeys
from dbqueue.engine.worker_rows import WorkerRows
from dbqueue.schema.tables import QueueTables

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


class QueueEngine:
    """Every job-lifecycle operation on one set of queue tables of one database, by part."""

    def __init__(
        self, tables: QueueTables, dialect: Dialect, instruments: Instruments | None = None
    ) -> None:
        self.tables = tables
        self.dialect = dialect
        self.jobs = tables.jobs
        #: Metrics and tracing observers (``instruments.py``); empty unless turned on.
        self.instruments = instruments if instruments is not None else Instruments()
        self.sql = Statements(tables, dialect)
        self.keys = KeyLines(self.sql)
        self.inserts = Inserts(self.sql, self.keys, self.instruments)
        self.unique = UniqueKeys(self.sql, self.keys, self.inserts)
        self.claims = Claims(self.sql, self.keys)
        self.outcomes = Outcomes(self.sql, self.keys, self.unique, self.inserts)
        self.cancels = Cancels(self.sql, self.keys, self.unique)
        self.queries = Queries(self.sql)
        self.morgue = Morgue(self.sql, self.keys, self.unique)
        self.periodic = PeriodicTicks(self.sql)
        self.slots = LimitSlots(self.sql)
        self.workers = WorkerRows(self.sql)
        self.housekeeping = Housekeeping(self.sql)

"""Housekeeping for the maintenance routines: the chunked purge of finished jobs, and the tick
table through which workers agree on which one runs a routine's tick."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy.engine import Connection

from dbqueue.engine import catalog
from dbqueue.engine.records import truncate
from dbqueue.engine.statements import Statements


class Housekeeping:
    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def purge_chunk(self, conn: Connection, max_age_days: float, limit: int) -> int:
        """Delete up to ``limit`` finished jobs older than ``max_age_days``, oldest first."""
        stmt = self.sql.new(catalog.jobs_purgeable_ids, max_age_days, limit)
        ids = list(conn.execute(stmt).scalars())
        if ids:
            conn.execute(self.sql.new(catalog.jobs_delete_finished, ids))
        return len(ids)

    def claim_tick(self, conn: Connection, routine: str, tick: dt.datetime, worker_id: str) -> bool:
        """Compare-and-set: the one worker whose UPDATE moves last_tick forward runs the tick."""
        stmt = self.sql.new(catalog.maintenance_claim_tick, routine, tick, worker_id)
        return conn.execute(stmt).rowcount == 1

    def record_tick(self, conn: Connection, routine: str, tick: dt.datetime, result: str) -> None:
        conn.execute(self.sql.new(catalog.maintenance_record, routine, tick, truncate(result)))

    def maintenance_status(self, conn: Connection) -> list[dict[str, Any]]:
        with self.sql.translate_errors():
            rows = conn.execute(self.sql.new(catalog.maintenance_status))
            return [dict(row._mapping) for row in rows]

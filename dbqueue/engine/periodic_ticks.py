"""The periodic-ticks table: the row (schedule name, tick) that makes a tick's job exactly one,
the last tick of each schedule, its status for monitoring, and the purge of old ticks."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection

from dbqueue.engine import catalog
from dbqueue.engine.statements import Statements


class PeriodicTicks:
    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def claim_periodic_tick(self, conn: Connection, name: str, tick: dt.datetime) -> bool:
        """Insert the tick's row in ``conn``'s transaction; False when it exists already (or
        another worker's transaction inserts it and commits first): that worker enqueues it.
        The primary key decides, with no lock and no duplicate-key error on any database."""
        with self.sql.translate_errors():
            params = {"name": name, "tick": tick, "job_id": None}
            result = conn.execute(self.sql(catalog.periodic_claim), params)
        return result.rowcount == 1

    def link_periodic_job(
        self, conn: Connection, name: str, tick: dt.datetime, job_id: int
    ) -> None:
        """Record which job a claimed tick enqueued (same transaction as the claim)."""
        conn.execute(self.sql.new(catalog.periodic_link, name, tick, job_id))

    def last_periodic_ticks(self, conn: Connection, names: Sequence[str]) -> dict[str, dt.datetime]:
        """Schedule name → its latest recorded tick (names without one are left out)."""
        if not names:
            return {}
        with self.sql.translate_errors():
            rows = conn.execute(self.sql.new(catalog.periodic_last_ticks, names)).all()
        return {name: tick for name, tick in rows}

    def periodic_status(self, conn: Connection) -> list[dict[str, Any]]:
        """Per schedule name in the table: its last tick, that tick's job and the job's status
        (None once purge removed the job), how many ticks are kept."""
        with self.sql.translate_errors():
            rows = conn.execute(self.sql.new(catalog.periodic_status)).all()
        return [
            {
                "name": name,
                "last_tick": tick,
                "last_job_id": job_id,
                "last_job_status": status,
                "ticks": int(ticks),
            }
            for name, tick, job_id, ticks, status in rows
        ]

    def purge_periodic_ticks(self, conn: Connection, max_age_days: float, limit: int) -> int:
        """Delete up to ``limit`` ticks older than ``max_age_days``, each schedule's latest tick
        excepted (it is what the next check compares with). Keys first, then DELETE by key:
        one form for every database (no DELETE … LIMIT on SingleStore's sharded tables)."""
        latest = dict(conn.execute(self.sql.new(catalog.periodic_last_ticks, None)).all())
        deleted = 0
        for name, last in sorted(latest.items()):
            if deleted >= limit:
                break
            stmt = catalog.periodic_old_ticks
            old = list(
                conn.execute(
                    self.sql.new(stmt, name, last, max_age_days, limit - deleted)
                ).scalars()
            )
            if old:
                conn.execute(self.sql.new(catalog.periodic_delete, name, old))
                deleted += len(old)
        return deleted

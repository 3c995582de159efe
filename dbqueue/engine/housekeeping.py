"""Housekeeping SQL for the maintenance routines: the chunked purge of finished jobs, and the
tick table through which workers agree on which one runs a routine's tick."""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue.engine.base import EngineBase
from dbqueue.engine.records import truncate
from dbqueue.job import Status


class Housekeeping(EngineBase):
    def purge_chunk(self, conn: Connection, max_age_days: float, limit: int) -> int:
        """Delete up to ``limit`` finished jobs older than ``max_age_days``, oldest first.

        Two statements (ids, then DELETE by id) because MySQL/MariaDB reject LIMIT in an IN
        subquery, and one form serves every database.
        """
        j = self.jobs
        cutoff = self.dialect.now_plus(-max_age_days * 86400)
        ids = list(
            conn.execute(
                sa.select(j.c.id)
                .where(j.c.status.in_(Status.FINISHED), j.c.finished_at < cutoff)
                .order_by(j.c.finished_at)
                .limit(limit)
            ).scalars()
        )
        if ids:
            conn.execute(sa.delete(j).where(j.c.id.in_(ids), j.c.status.in_(Status.FINISHED)))
        return len(ids)

    def claim_tick(self, conn: Connection, routine: str, tick: dt.datetime, worker_id: str) -> bool:
        """Compare-and-set: the one worker whose UPDATE moves last_tick forward runs the tick.

        Every database re-checks the WHERE clause on the row's latest committed version after
        waiting for a concurrent updater, so exactly one of the workers meeting on a tick wins.
        """
        m = self.tables.maintenance
        now = self.dialect.now()
        result = conn.execute(
            sa.update(m)
            .where(m.c.routine == routine, sa.or_(m.c.last_tick.is_(None), m.c.last_tick < tick))
            .values(
                last_tick=tick,
                started_at=now,
                finished_at=None,
                worker_id=worker_id,
                runs=m.c.runs + 1,
                result=None,
            )
        )
        return result.rowcount == 1

    def record_tick(self, conn: Connection, routine: str, tick: dt.datetime, result: str) -> None:
        m = self.tables.maintenance
        conn.execute(
            sa.update(m)
            .where(m.c.routine == routine, m.c.last_tick == tick)
            .values(finished_at=self.dialect.now(), result=truncate(result))
        )

    def maintenance_status(self, conn: Connection) -> list[dict[str, Any]]:
        m = self.tables.maintenance
        with self.translate_errors():
            rows = conn.execute(sa.select(m).order_by(m.c.routine))
            return [dict(row._mapping) for row in rows]

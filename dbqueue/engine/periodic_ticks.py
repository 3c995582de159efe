"""The periodic-ticks table: the row (schedule name, tick) that makes a tick's job exactly one,
the last tick of each schedule, its status for monitoring, and the purge of old ticks."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue.engine.base import EngineBase
from dbqueue.schema.types import UtcDateTime


class PeriodicTicks(EngineBase):
    def claim_periodic_tick(self, conn: Connection, name: str, tick: dt.datetime) -> bool:
        """Insert the tick's row in ``conn``'s transaction; False when it exists already (or
        another worker's transaction inserts it and commits first): that worker enqueues it.
        The primary key decides, with no lock and no duplicate-key error on any database."""
        p = self.tables.periodic
        stmt = self.statement("periodic:claim", lambda: self.dialect.insert_unless_present(p))
        with self.translate_errors():
            result = conn.execute(stmt, {"name": name, "tick": tick, "job_id": None})
        return result.rowcount == 1

    def link_periodic_job(
        self, conn: Connection, name: str, tick: dt.datetime, job_id: int
    ) -> None:
        """Record which job a claimed tick enqueued (same transaction as the claim)."""
        p = self.tables.periodic
        conn.execute(sa.update(p).where(p.c.name == name, p.c.tick == tick).values(job_id=job_id))

    def last_periodic_ticks(self, conn: Connection, names: Sequence[str]) -> dict[str, dt.datetime]:
        """Schedule name → its latest recorded tick (names without one are left out)."""
        if not names:
            return {}
        p = self.tables.periodic
        stmt = (
            sa.select(p.c.name, sa.type_coerce(sa.func.max(p.c.tick), UtcDateTime()))
            .where(p.c.name.in_(list(names)))
            .group_by(p.c.name)
        )
        with self.translate_errors():
            rows = conn.execute(stmt).all()
        return {name: tick for name, tick in rows}

    def periodic_status(self, conn: Connection) -> list[dict[str, Any]]:
        """Per schedule name in the table: its last tick, that tick's job and the job's status
        (None once purge removed the job), how many ticks are kept."""
        p, j = self.tables.periodic, self.jobs
        latest = (
            sa.select(
                p.c.name,
                sa.func.max(p.c.tick).label("tick"),
                sa.func.count().label("ticks"),
            )
            .group_by(p.c.name)
            .subquery()
        )
        stmt = (
            sa.select(p.c.name, p.c.tick, p.c.job_id, latest.c.ticks, j.c.status)
            .join(latest, sa.and_(p.c.name == latest.c.name, p.c.tick == latest.c.tick))
            .outerjoin(j, j.c.id == p.c.job_id)
            .order_by(p.c.name)
        )
        with self.translate_errors():
            rows = conn.execute(stmt).all()
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
        p = self.tables.periodic
        latest = {
            name: tick
            for name, tick in conn.execute(
                sa.select(p.c.name, sa.type_coerce(sa.func.max(p.c.tick), UtcDateTime())).group_by(
                    p.c.name
                )
            )
        }
        cutoff = self.dialect.now_plus(-max_age_days * 86400)
        deleted = 0
        for name, last in sorted(latest.items()):
            if deleted >= limit:
                break
            old = list(
                conn.execute(
                    sa.select(p.c.tick)
                    .where(p.c.name == name, p.c.tick < last, p.c.tick < cutoff)
                    .order_by(p.c.tick)
                    .limit(limit - deleted)
                ).scalars()
            )
            if old:
                conn.execute(sa.delete(p).where(p.c.name == name, p.c.tick.in_(old)))
                deleted += len(old)
        return deleted

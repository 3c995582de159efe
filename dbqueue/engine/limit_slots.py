"""Queue-limit slots: the rows of ``<jobs>_slots``, one per (queue, slot number).

A queue limited to N has slots 0..N-1; a job of it runs while its worker holds one. How a slot
is held is the strategy's business (a row lock, a named lock, the database's one write lock);
here are the statements they use: the free-slot query a strategy locks its own way, the rows'
creation, and the holder's record.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue.engine.base import EngineBase


class Slots(EngineBase):
    def free_slot(self) -> sa.Select:
        """The lowest slot of queue ``:queue`` numbered below ``:slots``; a strategy adds its
        locking (``FOR UPDATE SKIP LOCKED``: the first slot nobody holds)."""
        s = self.tables.slots
        return (
            sa.select(s.c.slot)
            .where(
                s.c.queue == sa.bindparam("queue", type_=s.c.queue.type),
                s.c.slot < sa.bindparam("slots", type_=sa.Integer()),
            )
            .order_by(s.c.slot)
            .limit(1)
        )

    def take_slot(self, conn: Connection, stmt: sa.Select, queue: str, slots: int) -> int | None:
        """Execute a statement built once on ``free_slot()``: the slot it locked, or None."""
        rows = self.compiled(stmt).raw_rows(conn, {"queue": queue, "slots": slots})
        return int(rows[0][0]) if rows else None

    def ensure_slots(self, conn: Connection, queue: str, count: int) -> int:
        """Create the slots 0..count-1 of ``queue`` that do not exist yet (in the caller's
        transaction); return how many slots the queue has now. Two workers starting at once
        may insert the same row: one of them gets an IntegrityError and tries again."""
        s = self.tables.slots
        have = self.slot_numbers(conn, queue)
        missing = [number for number in range(count) if number not in have]
        if missing:
            conn.execute(sa.insert(s), [{"queue": queue, "slot": n} for n in missing])
        return len(have) + len(missing)

    def slot_numbers(self, conn: Connection, queue: str) -> set[int]:
        s = self.tables.slots
        with self.translate_errors():
            return set(conn.execute(sa.select(s.c.slot).where(s.c.queue == queue)).scalars())

    def record_slot(
        self, conn: Connection, queue: str, slot: int, job_id: int, worker_id: str
    ) -> None:
        """Write who holds a slot now (lock-based strategies, in their committed claim)."""
        s = self.tables.slots
        conn.execute(
            sa.update(s)
            .where(s.c.queue == queue, s.c.slot == slot)
            .values(job_id=job_id, worker_id=worker_id, taken_at=self.dialect.now())
        )

    def slot_rows(self, conn: Connection, queue: str | None = None) -> list[dict[str, Any]]:
        """The slot rows (of one queue), by queue and slot number."""
        s = self.tables.slots
        stmt = sa.select(s).order_by(s.c.queue, s.c.slot)
        if queue is not None:
            stmt = stmt.where(s.c.queue == queue)
        with self.translate_errors():
            return [dict(row._mapping) for row in conn.execute(stmt)]

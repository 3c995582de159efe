"""Queue-limit slots: the rows of ``<jobs>_slots``, one per (queue, slot number).

A queue limited to N has slots 0..N-1; a job of it runs while its worker holds one. How a slot
is held is the strategy's business (a row lock, a named lock, the database's one write lock),
through the claim statements (``Claims.free_slot``, ``take_slot``, ``record_slot``); here are the
rows' creation and what monitoring reads.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from dbqueue.engine import catalog
from dbqueue.engine.statements import Statements


class LimitSlots:
    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def ensure_slots(self, conn: Connection, queue: str, count: int) -> int:
        """Create the slots 0..count-1 of ``queue`` that do not exist yet (in the caller's
        transaction); return how many slots the queue has now. Two workers starting at once
        may insert the same row: one of them gets an IntegrityError and tries again."""
        have = self.slot_numbers(conn, queue)
        missing = [number for number in range(count) if number not in have]
        if missing:
            rows = [{"queue": queue, "slot": n} for n in missing]
            conn.execute(self.sql.new(catalog.slots_add), rows)
        return len(have) + len(missing)

    def slot_numbers(self, conn: Connection, queue: str) -> set[int]:
        with self.sql.translate_errors():
            return set(conn.execute(self.sql.new(catalog.slots_numbers, queue)).scalars())

    def slot_rows(self, conn: Connection, queue: str | None = None) -> list[dict[str, Any]]:
        """The slot rows (of one queue), by queue and slot number."""
        with self.sql.translate_errors():
            rows = conn.execute(self.sql.new(catalog.slots_rows, queue))
            return [dict(row._mapping) for row in rows]

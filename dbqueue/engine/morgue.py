"""The morgue (Lowkiq's name for the dead jobs): list them, requeue them (a keyed one at the back
of its key's line, a unique one only if its key is free) and delete them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy.engine import Connection

from dbqueue.engine import catalog
from dbqueue.engine.keys import KeyLines
from dbqueue.engine.statements import Statements
from dbqueue.engine.unique import UniqueKeys

#: Ids per statement in the morgue's bulk actions (an IN list every database takes).
CHUNK = 500


def _chunks(ids: Sequence[int]) -> Iterable[list[int]]:
    values = list(ids)
    for start in range(0, len(values), CHUNK):
        yield values[start : start + CHUNK]


class Morgue:
    def __init__(self, sql: Statements, keys: KeyLines, unique: UniqueKeys) -> None:
        self.sql = sql
        self.keys = keys
        self.unique = unique

    def dead_jobs(
        self,
        conn: Connection,
        queue: str | None,
        limit: int,
        *,
        task: str | None = None,
        order_by: str = "finished_at",
    ) -> list[dict[str, Any]]:
        """Dead jobs of one queue/task (None: any): ``finished_at`` newest death first,
        ``id`` oldest job first (the order they were enqueued)."""
        stmt = self.sql.new(catalog.jobs_dead, queue, task, limit, order_by)
        with self.sql.translate_errors():
            return [dict(row._mapping) for row in conn.execute(stmt)]

    def dead_ids(self, conn: Connection, queue: str | None, task: str | None) -> list[int]:
        """Every dead job's id matching the filter, locked until the transaction ends so that
        a concurrent requeue or delete waits for this one instead of reporting the same ids."""
        stmt = self.sql.new(catalog.jobs_dead_ids_locked, queue, task)
        with self.sql.translate_errors():
            return [int(i) for i in conn.execute(stmt).scalars()]

    def _dead_among(self, conn: Connection, ids: Sequence[int]) -> list[int]:
        found: list[int] = []
        for chunk in _chunks(ids):
            stmt = self.sql.new(catalog.jobs_dead_among_locked, chunk)
            found.extend(int(i) for i in conn.execute(stmt).scalars())
        return sorted(found)

    def delete_dead(self, conn: Connection, ids: Sequence[int]) -> list[int]:
        """Delete the jobs among ``ids`` that are dead; returns those ids."""
        with self.sql.translate_errors():
            found = self._dead_among(conn, ids)
            for chunk in _chunks(found):
                conn.execute(self.sql.new(catalog.jobs_delete_dead, chunk))
        return found

    def requeue_dead(self, conn: Connection, ids: Sequence[int]) -> list[int]:
        """Put dead jobs back to run now with a fresh attempt count (a keyed one at the back of
        its key's line); returns the ids requeued. A dead job whose unique key another
        unfinished job holds now stays dead."""
        with self.sql.translate_errors():
            found = self._dead_among(conn, ids)
            if found:
                found = self.unique.retake_keys(conn, found)
            for chunk in _chunks(found):
                conn.execute(self.sql.new(catalog.jobs_requeue_dead, chunk))
            if found:
                self.keys.join_lines(conn, found)  # keyed ones go to the back of their line
        return sorted(int(i) for i in found)

    def announce_requeued(self, conn: Connection, ids: Sequence[int]) -> list[str]:
        """Wake the workers of the requeued jobs' queues when the transaction commits, where
        the database pushes (no insert's trigger does it); returns those queues."""
        queues: set[str] = set()
        with self.sql.translate_errors():
            for chunk in _chunks(ids):
                queues.update(conn.execute(self.sql.new(catalog.jobs_queues_of, chunk)).scalars())
            self.sql.announce_runnable(conn, sorted(queues))
        return sorted(queues)

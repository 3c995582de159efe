"""The registry of live workers: the rows of ``<jobs>_workers``, one per worker process.

A worker inserts its row at start, a thread of its own updates it every few seconds (the
heartbeat: what runs now, the counters, a new ``expires_at``) and deletes it at exit. A row past
its ``expires_at`` is a worker that went without a word (killed, host lost): readers show it as
gone and maintenance deletes it. Every time is the database's clock, which all workers share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import Connection

from dbqueue.engine import catalog
from dbqueue.engine.statements import Statements


class WorkerRows:
    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def register_worker(self, conn: Connection, values: Mapping[str, Any], ttl: float) -> None:
        """Insert this worker's row; it is live for ``ttl`` seconds unless heartbeated."""
        conn.execute(self.sql.new(catalog.workers_register, values, ttl))

    def heartbeat_worker(
        self, conn: Connection, worker_id: str, values: Mapping[str, Any], ttl: float
    ) -> bool:
        """Record what the worker runs and has done; False when its row is gone (deleted as
        stale after a long stall: the caller inserts it again)."""
        result = conn.execute(self.sql.new(catalog.workers_beat, worker_id, values, ttl))
        return result.rowcount == 1

    def unregister_worker(self, conn: Connection, worker_id: str) -> None:
        conn.execute(self.sql.new(catalog.workers_delete, worker_id))

    def worker_rows(self, conn: Connection, include_gone: bool = False) -> list[dict[str, Any]]:
        """Every worker's row, oldest first, with ``alive`` (its heartbeat has not expired) and
        ``now`` (the database clock the rows were judged by)."""
        with self.sql.translate_errors():
            stmt = self.sql.new(catalog.workers_all, include_gone)
            rows = [dict(row._mapping) for row in conn.execute(stmt)]
        for row in rows:
            row["alive"] = bool(row["alive"])
        return rows

    def check_workers_table(self, conn: Connection) -> None:
        """Raise SchemaMissingError (run ``dbqueue migrate``) unless the table is there: for
        readers whose rows come from elsewhere (SQLite's side file)."""
        with self.sql.translate_errors():
            conn.execute(self.sql.new(catalog.workers_probe)).all()

    def forget_gone_workers(self, conn: Connection) -> list[str]:
        """Delete the rows of workers whose heartbeat expired; return their names."""
        rows = conn.execute(self.sql.new(catalog.workers_gone)).all()
        if rows:
            conn.execute(self.sql.new(catalog.workers_delete_gone, [r.id for r in rows]))
        return [r.name for r in rows]

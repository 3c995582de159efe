"""The registry of live workers: the rows of ``<jobs>_workers``, one per worker process.

A worker inserts its row at start, a thread of its own updates it every few seconds (the
heartbeat: what runs now, the counters, a new ``expires_at``) and deletes it at exit. A row past
its ``expires_at`` is a worker that went without a word (killed, host lost): readers show it as
gone and maintenance deletes it. Every time is the database's clock, which all workers share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue.engine.base import EngineBase
from dbqueue.job import Status

#: The most job ids one "which of these still wait" query binds (a worker reports a few).
_MAX_IDS = 1000


class WorkerRows(EngineBase):
    def register_worker(self, conn: Connection, values: Mapping[str, Any], ttl: float) -> None:
        """Insert this worker's row; it is live for ``ttl`` seconds unless heartbeated."""
        w = self.tables.workers
        now = self.dialect.now()
        row = {**values, "started_at": now, "heartbeat_at": now}
        conn.execute(sa.insert(w).values(expires_at=self.dialect.now_plus(ttl), **row))

    def heartbeat_worker(
        self, conn: Connection, worker_id: str, values: Mapping[str, Any], ttl: float
    ) -> bool:
        """Record what the worker runs and has done; False when its row is gone (deleted as
        stale after a long stall: the caller inserts it again)."""
        w = self.tables.workers
        result = conn.execute(
            sa.update(w)
            .where(w.c.id == worker_id)
            .values(
                heartbeat_at=self.dialect.now(),
                expires_at=self.dialect.now_plus(ttl),
                **values,
            )
        )
        return result.rowcount == 1

    def unregister_worker(self, conn: Connection, worker_id: str) -> None:
        w = self.tables.workers
        conn.execute(sa.delete(w).where(w.c.id == worker_id))

    def worker_rows(self, conn: Connection, include_gone: bool = False) -> list[dict[str, Any]]:
        """Every worker's row, oldest first, with ``alive`` (its heartbeat has not expired) and
        ``now`` (the database clock the rows were judged by)."""
        w = self.tables.workers
        now = self.db_now()
        alive = sa.case((w.c.expires_at >= now, True), else_=False).label("alive")
        stmt = sa.select(w, alive, now.label("now")).order_by(w.c.started_at, w.c.id)
        if not include_gone:
            stmt = stmt.where(w.c.expires_at >= now)
        with self.translate_errors():
            rows = [dict(row._mapping) for row in conn.execute(stmt)]
        for row in rows:
            row["alive"] = bool(row["alive"])
        return rows

    def check_workers_table(self, conn: Connection) -> None:
        """Raise SchemaMissingError (run ``dbqueue migrate``) unless the table is there: for
        readers whose rows come from elsewhere (SQLite's side file)."""
        w = self.tables.workers
        with self.translate_errors():
            conn.execute(sa.select(w.c.id).limit(0)).all()

    def forget_gone_workers(self, conn: Connection) -> list[str]:
        """Delete the rows of workers whose heartbeat expired; return their names."""
        w = self.tables.workers
        gone = w.c.expires_at < self.dialect.now()
        rows = conn.execute(sa.select(w.c.id, w.c.name).where(gone)).all()
        if rows:
            conn.execute(sa.delete(w).where(w.c.id.in_([r.id for r in rows]), gone))
        return [r.name for r in rows]

    def still_available(self, conn: Connection, ids: Sequence[int]) -> dict[str, int]:
        """Per queue, how many of these jobs are runnable ``available`` rows: jobs that live
        workers report running inside an open claim transaction (skip_locked, SQLite), where
        the row keeps its status until the outcome commits."""
        j = self.jobs
        found: dict[str, int] = {}
        ids = sorted(set(ids))
        for start in range(0, len(ids), _MAX_IDS):
            stmt = (
                sa.select(j.c.queue, sa.func.count())
                .where(
                    j.c.id.in_(ids[start : start + _MAX_IDS]),
                    j.c.status == Status.AVAILABLE,
                    j.c.run_at <= self.dialect.now(),
                )
                .group_by(j.c.queue)
            )
            for queue, n in conn.execute(stmt):
                found[queue] = found.get(queue, 0) + int(n)
        return found

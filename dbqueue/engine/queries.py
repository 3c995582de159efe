"""Reads and admin writes for the API, the CLI and the dashboard: one job, equivalent jobs,
per-queue stats, the dead jobs and their requeue; and the polling reads a worker and its
maintenance make between claims (due times, runnable queues, running jobs). Off the hot path:
plain Core statements."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue.base import payload as payload_codec
from dbqueue.engine.records import QueueStats
from dbqueue.engine.unique import UniqueKeys
from dbqueue.job import Job, Status
from dbqueue.schema.types import UtcDateTime


class Queries(UniqueKeys):
    def get(self, conn: Connection, job_id: int) -> dict[str, Any] | None:
        with self.translate_errors():
            row = conn.execute(sa.select(self.jobs).where(self.jobs.c.id == job_id)).first()
        return dict(row._mapping) if row is not None else None

    def finish_state(self, conn: Connection, job_id: int) -> dict[str, Any] | None:
        """What a caller waiting for a job reads (``app.result``, ``app.call``): where it is,
        and its result or last message; None if there is no such job."""
        j = self.jobs
        columns = ("id", "task", "queue", "status", "attempt", "max_attempts", "run_at")
        stmt = sa.select(
            *(j.c[name] for name in columns), j.c.result, j.c.message, j.c.awaited
        ).where(j.c.id == job_id)
        with self.translate_errors():
            row = conn.execute(stmt).first()
        return dict(row._mapping) if row is not None else None

    def find_equivalent(
        self,
        conn: Connection,
        task: str,
        encoded: payload_codec.EncodedPayload,
        statuses: Iterable[str],
        filters: dict[str, Any],
    ) -> list[dict[str, Any]]:
        j = self.jobs
        stmt = sa.select(self.jobs).where(
            j.c.task == task,
            j.c.payload_hash == payload_codec.payload_hash(encoded),
            j.c.status.in_(list(statuses)),
        )
        for column, value in filters.items():
            stmt = stmt.where(j.c[column].is_(None) if value is None else j.c[column] == value)
        with self.translate_errors():
            rows = conn.execute(stmt.order_by(j.c.id)).all()
        return [dict(row._mapping) for row in rows]

    def stats(self, conn: Connection) -> tuple[list[QueueStats], dt.datetime]:
        """Counts per queue and status, scheduled jobs, and the age of the oldest runnable job."""
        j = self.jobs
        now = self.dialect.now()
        waiting = j.c.status == Status.AVAILABLE
        scheduled = sa.case((sa.and_(waiting, j.c.run_at > now), 1), else_=0)
        runnable_since = sa.case((sa.and_(waiting, j.c.run_at <= now), j.c.run_at), else_=None)
        stmt = sa.select(
            j.c.queue,
            j.c.status,
            sa.func.count().label("n"),
            sa.func.sum(scheduled).label("scheduled"),
            sa.type_coerce(sa.func.min(runnable_since), UtcDateTime()).label("oldest"),
        ).group_by(j.c.queue, j.c.status)
        with self.translate_errors():
            db_now = conn.execute(sa.select(self.db_now())).scalar_one()
            rows = conn.execute(stmt).all()
        by_queue: dict[str, dict[str, Any]] = {}
        for queue, status, n, n_scheduled, oldest in rows:
            entry = by_queue.setdefault(queue, {"counts": {}, "scheduled": 0, "oldest": None})
            entry["counts"][status] = int(n)
            entry["scheduled"] += int(n_scheduled or 0)
            if oldest is not None:
                entry["oldest"] = (
                    oldest if entry["oldest"] is None else min(entry["oldest"], oldest)
                )
        result = [
            QueueStats(
                queue=queue,
                counts=entry["counts"],
                scheduled=entry["scheduled"],
                oldest_runnable_age=(db_now - entry["oldest"]).total_seconds()
                if entry["oldest"] is not None
                else None,
            )
            for queue, entry in sorted(by_queue.items())
        ]
        return result, db_now

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
        j = self.jobs
        order = (j.c.finished_at.desc(), j.c.id.desc()) if order_by == "finished_at" else (j.c.id,)
        stmt = sa.select(j).where(self._dead(queue, task)).order_by(*order).limit(limit)
        with self.translate_errors():
            return [dict(row._mapping) for row in conn.execute(stmt)]

    def dead_ids(self, conn: Connection, queue: str | None, task: str | None) -> list[int]:
        """Every dead job's id matching the filter, locked until the transaction ends so that
        a concurrent requeue or delete waits for this one instead of reporting the same ids."""
        j = self.jobs
        stmt = sa.select(j.c.id).where(self._dead(queue, task)).order_by(j.c.id).with_for_update()
        with self.translate_errors():
            return [int(i) for i in conn.execute(stmt).scalars()]

    def _dead(self, queue: str | None, task: str | None) -> sa.ColumnElement:
        j = self.jobs
        where = [j.c.status == Status.DEAD]
        if queue is not None:
            where.append(j.c.queue == queue)
        if task is not None:
            where.append(j.c.task == task)
        return sa.and_(*where)

    def _dead_among(self, conn: Connection, ids: Sequence[int]) -> list[int]:
        j = self.jobs
        found: list[int] = []
        for chunk in _chunks(ids):
            stmt = sa.select(j.c.id).where(j.c.id.in_(chunk), j.c.status == Status.DEAD)
            found.extend(int(i) for i in conn.execute(stmt.with_for_update()).scalars())
        return sorted(found)

    def delete_dead(self, conn: Connection, ids: Sequence[int]) -> list[int]:
        """Delete the jobs among ``ids`` that are dead; returns those ids."""
        j = self.jobs
        with self.translate_errors():
            found = self._dead_among(conn, ids)
            for chunk in _chunks(found):
                conn.execute(sa.delete(j).where(j.c.id.in_(chunk), j.c.status == Status.DEAD))
        return found

    def requeue_dead(self, conn: Connection, ids: Sequence[int]) -> list[int]:
        """Put dead jobs back to run now with a fresh attempt count (a keyed one at the back of
        its key's line); returns the ids requeued. A dead job whose unique key another
        unfinished job holds now stays dead."""
        j = self.jobs
        with self.translate_errors():
            found = self._dead_among(conn, ids)
            if found:
                found = self.retake_keys(conn, found)
            now = self.dialect.now()
            for chunk in _chunks(found):
                # previous_message is assigned first: MySQL evaluates SET left to right with the
                # values already assigned, so it must copy message before message changes.
                conn.execute(
                    sa.update(j)
                    .where(j.c.id.in_(chunk), j.c.status == Status.DEAD)
                    .ordered_values(
                        (j.c.previous_message, j.c.message),
                        (j.c.previous_status, Status.DEAD),
                        (j.c.message, "requeued from the dead jobs"),
                        (j.c.status, Status.AVAILABLE),
                        (j.c.attempt, 0),
                        (j.c.run_at, now),
                        (j.c.finished_at, None),
                        (j.c.worker_id, None),
                        (j.c.updated_at, now),
                    )
                )
            if found:
                self.join_lines(conn, found)  # keyed ones go to the back of their key's line
        return sorted(int(i) for i in found)

    def running_jobs(self, conn: Connection, limit: int) -> list[Job]:
        j = self.jobs
        rows = conn.execute(
            sa.select(*self._job_columns, j.c.started_at)
            .where(j.c.status == Status.RUNNING)
            .order_by(j.c.id)
            .limit(limit)
        )
        return [Job.from_tuple(row, 0) for row in rows]

    def runnable_queues(self, conn: Connection, waited: float = 0.0) -> list[str]:
        """Queues holding jobs that have been runnable for at least ``waited`` seconds."""
        j = self.jobs
        rows = conn.execute(
            sa.select(j.c.queue)
            .where(j.c.status == Status.AVAILABLE, j.c.run_at <= self.dialect.now_plus(-waited))
            .group_by(j.c.queue)
        )
        return sorted(rows.scalars())

    def next_due_in(self, conn: Connection, queues: Sequence[str]) -> float | None:
        """Seconds until the earliest scheduled job of these queues becomes runnable.

        Only future jobs count: past-due ones that a claim did not get are held by other
        workers (a SKIP LOCKED claim leaves them 'available' until it commits).
        """
        j = self.jobs
        soonest = conn.execute(
            sa.select(
                sa.type_coerce(sa.func.min(j.c.run_at), UtcDateTime()),
                self.db_now(),
            ).where(
                j.c.status == Status.AVAILABLE,
                j.c.queue.in_(list(queues)),
                j.c.run_at > self.dialect.now(),
            )
        ).one()
        if soonest[0] is None:
            return None
        return max(0.0, (soonest[0] - soonest[1]).total_seconds())


#: Ids per statement in the morgue's bulk actions (an IN list every database takes).
CHUNK = 500


def _chunks(ids: Sequence[int]) -> Iterable[list[int]]:
    values = list(ids)
    for start in range(0, len(values), CHUNK):
        yield values[start : start + CHUNK]

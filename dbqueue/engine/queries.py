"""Reads for the API, the CLI, the dashboard and the worker between claims: one job, equivalent
jobs, per-queue stats, committed states, running jobs, runnable queues and the next due time.
Off the hot path: plain Core statements from the catalog."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy.engine import Connection

from dbqueue.base import payload as payload_codec
from dbqueue.engine import catalog
from dbqueue.engine.records import QueueStats
from dbqueue.engine.statements import Statements
from dbqueue.job import Job

#: The most job ids one look-up by primary key binds (each worker reports a few).
_MAX_IDS = 1000


class Queries:
    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def get(self, conn: Connection, job_id: int) -> dict[str, Any] | None:
        with self.sql.translate_errors():
            row = conn.execute(self.sql.new(catalog.jobs_get, job_id)).first()
        return dict(row._mapping) if row is not None else None

    def finish_state(self, conn: Connection, job_id: int) -> dict[str, Any] | None:
        """What a caller waiting for a job reads (``app.result``, ``app.call``): where it is,
        and its result or last message; None if there is no such job."""
        with self.sql.translate_errors():
            row = conn.execute(self.sql.new(catalog.jobs_finish_state, job_id)).first()
        return dict(row._mapping) if row is not None else None

    def find_equivalent(
        self,
        conn: Connection,
        task: str,
        encoded: payload_codec.EncodedPayload,
        statuses: Iterable[str],
        filters: dict[str, Any],
    ) -> list[dict[str, Any]]:
        digest = payload_codec.payload_hash(encoded)
        stmt = self.sql.new(catalog.jobs_equivalent, task, digest, statuses, filters)
        with self.sql.translate_errors():
            rows = conn.execute(stmt).all()
        return [dict(row._mapping) for row in rows]

    def stats(
        self, conn: Connection, in_flight: Sequence[int] = ()
    ) -> tuple[list[QueueStats], dt.datetime]:
        """Counts per queue and status, scheduled jobs, and the age of the oldest runnable job;
        ``in_flight``: ids of jobs live workers run inside their claim's transaction (their
        rows say available): counted apart, and no part of the lag."""
        with self.sql.translate_errors():
            db_now = conn.execute(self.sql.new(catalog.clock)).scalar_one()
            rows = conn.execute(self.sql.new(catalog.jobs_stats, sorted(set(in_flight)))).all()
        by_queue: dict[str, dict[str, Any]] = {}
        for queue, status, n, n_scheduled, oldest, *n_in_flight in rows:
            entry = by_queue.setdefault(
                queue, {"counts": {}, "scheduled": 0, "in_flight": 0, "oldest": None}
            )
            entry["counts"][status] = int(n)
            entry["scheduled"] += int(n_scheduled or 0)
            entry["in_flight"] += int(n_in_flight[0] or 0) if n_in_flight else 0
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
                in_flight=entry["in_flight"],
            )
            for queue, entry in sorted(by_queue.items())
        ]
        return result, db_now

    def job_states(self, conn: Connection, ids: Sequence[int]) -> dict[int, str]:
        """The committed status of each of ``ids`` that exists; never waits for a lock."""
        if not ids:
            return {}
        with self.sql.translate_errors():
            rows = conn.execute(self.sql.new(catalog.jobs_states, ids))
            return {int(job_id): status for job_id, status in rows}

    def publication_jobs(self, conn: Connection, publication_id: int) -> list[int]:
        """The jobs of one publication: its deliveries and their dead-letter jobs (not the
        publication's own record, which is finished from the start)."""
        with self.sql.translate_errors():
            rows = conn.execute(self.sql.new(catalog.jobs_of_publication, publication_id))
            return [int(job_id) for job_id in rows.scalars()]

    def running_jobs(self, conn: Connection, limit: int) -> list[Job]:
        rows = conn.execute(self.sql.new(catalog.jobs_running, limit))
        return [Job.from_tuple(row, 0) for row in rows]

    def lease_expired(self, conn: Connection, limit: int) -> list[Job]:
        """Running jobs whose lease ended (rescue retries them)."""
        rows = conn.execute(self.sql.new(catalog.jobs_lease_expired, limit))
        return [Job.from_tuple(row, 0) for row in rows]

    def runnable_queues(self, conn: Connection, waited: float = 0.0) -> list[str]:
        """Queues holding jobs that have been runnable for at least ``waited`` seconds."""
        rows = conn.execute(self.sql.new(catalog.jobs_runnable_queues, waited))
        return sorted(rows.scalars())

    def next_due_in(self, conn: Connection, queues: Sequence[str]) -> float | None:
        """Seconds until the earliest scheduled job of these queues becomes runnable.

        Only future jobs count: past-due ones that a claim did not get are held by other
        workers (a SKIP LOCKED claim leaves them 'available' until it commits).
        """
        soonest = conn.execute(self.sql.new(catalog.jobs_next_due, queues)).one()
        if soonest[0] is None:
            return None
        return max(0.0, (soonest[0] - soonest[1]).total_seconds())

    def attempt_states(self, conn: Connection, ids: Sequence[int]) -> dict[int, tuple[str, int]]:
        """id → (status, attempt) of each of ``ids`` that exists, looked up by primary key (the
        jobs live workers report running); never waits for a lock."""
        found: dict[int, tuple[str, int]] = {}
        ids = sorted(set(ids))
        with self.sql.translate_errors():
            for start in range(0, len(ids), _MAX_IDS):
                stmt = self.sql.new(catalog.jobs_attempt_states, ids[start : start + _MAX_IDS])
                for job_id, status, attempt in conn.execute(stmt):
                    found[int(job_id)] = (status, int(attempt))
        return found

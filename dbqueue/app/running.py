"""What runs now, whatever the claim strategy.

A committed claim writes ``running`` on the job's row. A claim held in the worker's open
transaction (skip_locked, SQLite) changes the row only when the outcome commits: meanwhile the
row says ``available``, at the attempt before the one running, and only the registry of live
workers knows (its ``jobs`` column: what each live worker ran at its last heartbeat). So a job
runs if its row says so, or a live worker lists it while its row still says ``available`` one
attempt behind the attempt listed (once the outcome commits, the row moves on: a stale listing
counts for nothing). Readers read the registry once and look the listed ids up by primary key.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dbqueue.job import Status

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from dbqueue.runtime.context import RuntimeContext


@dataclasses.dataclass(frozen=True)
class RunningJob:
    """One job running now: ``attempt`` is the attempt running (1: the first), ``worker`` the
    name of the worker process running it (from the registry; from the row's ``worker_id``
    when the registry does not list it yet), ``since`` when that attempt started;
    ``in_transaction``: its row still says ``available`` (the claim lives in the worker's open
    transaction)."""

    id: int
    attempt: int
    worker: str
    since: dt.datetime | None
    in_transaction: bool = False

    def on(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """``row`` as this job runs: status ``running``, the attempt running."""
        return {**row, "status": Status.RUNNING, "attempt": self.attempt}


def listed(worker_rows: Iterable[Mapping[str, Any]]) -> dict[int, RunningJob]:
    """Job id → the job as the live workers' registry rows list it (the latest attempt when
    two list one job: a worker that lost it has not beaten since)."""
    found: dict[int, RunningJob] = {}
    for worker in worker_rows:
        for job in worker.get("jobs") or []:
            try:
                entry = RunningJob(
                    int(job["id"]), int(job["attempt"]), worker["name"], _time(job.get("since"))
                )
            except (KeyError, TypeError, ValueError):  # a row written by someone else
                continue
            if entry.id not in found or found[entry.id].attempt < entry.attempt:
                found[entry.id] = entry
    return found


def runs(entry: RunningJob | None, status: str, attempt: int) -> RunningJob | None:
    """``entry`` (a listing) if the job's row, at ``status`` and ``attempt``, still runs the
    attempt listed; None if it does not (finished, or failed and waiting for a retry)."""
    if entry is None:
        return None
    if status == Status.RUNNING and attempt == entry.attempt:
        return entry
    if status == Status.AVAILABLE and attempt == entry.attempt - 1:
        return dataclasses.replace(entry, in_transaction=True)
    return None


def read_listed(context: RuntimeContext, conn: Connection) -> dict[int, RunningJob]:
    """The registry's listing (one read of the live workers' rows)."""
    with context.workers_connection(conn) as registry:
        rows = context.queue_engine(registry).workers.worker_rows(registry)
    return listed(rows)


def confirmed(
    context: RuntimeContext, conn: Connection, listing: Mapping[int, RunningJob]
) -> dict[int, RunningJob]:
    """Those listed jobs whose rows agree they run, looked up by primary key on ``conn``."""
    if not listing:
        return {}
    states = context.queue_engine(conn).queries.attempt_states(conn, list(listing))
    found = {}
    for job_id, entry in listing.items():
        job = runs(entry, *states[job_id]) if job_id in states else None
        if job is not None:
            found[job_id] = job
    return found


def running_now(context: RuntimeContext, conn: Connection) -> dict[int, RunningJob]:
    """Job id → the jobs live workers run now that their rows agree they run (jobs committed
    as ``running`` that no live worker lists are not here: their rows say so)."""
    return confirmed(context, conn, read_listed(context, conn))


def in_flight(running: Mapping[int, RunningJob]) -> list[int]:
    """The ids of those jobs whose rows still say ``available``."""
    return sorted(job.id for job in running.values() if job.in_transaction)


def of_rows(
    context: RuntimeContext, conn: Connection, rows: Sequence[Mapping[str, Any]]
) -> dict[int, RunningJob]:
    """Job id → how each of these job rows (every column) runs, for those that run: the
    registry is read only when one of them may (its status is ``available`` or ``running``).
    A ``running`` row no live worker lists (a committed claim the worker has not reported
    yet) runs as its row says: worker_id, started_at, attempt."""
    maybe = [row for row in rows if row["status"] in (Status.AVAILABLE, Status.RUNNING)]
    if not maybe:
        return {}
    listing = read_listed(context, conn)
    found = {}
    for row in maybe:
        job = runs(listing.get(row["id"]), row["status"], row["attempt"])
        if job is None and row["status"] == Status.RUNNING:
            job = RunningJob(row["id"], row["attempt"], row["worker_id"] or "", row["started_at"])
        if job is not None:
            found[row["id"]] = job
    return found


def _time(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime) or value is None:
        return value
    return dt.datetime.fromisoformat(str(value))

"""The SQL the dashboard runs (the README's "SQL the dashboard uses" shows it for BI tools).

Pages stay fast on tables of millions of rows: lists are keyset-paginated (``id < :before
ORDER BY id DESC LIMIT n``, never OFFSET), counts stop at COUNT_CAP (a page says "10,000+"),
and the throughput chart reads only the last hour through the ``finished_at`` index.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from dbqueue.app import running
from dbqueue.app.facade import App
from dbqueue.job import Status

PAGE_SIZE = 50
COUNT_CAP = 10_000
#: The throughput chart: this many buckets of BUCKET_MINUTES over the last hour.
BUCKETS = 12
BUCKET_MINUTES = 5
#: The statuses a jobs filter offers; "scheduled" is an available job whose run_at is ahead.
STATUSES = ("available", "scheduled", "running", "succeeded", "dead", "cancelled")
#: The filters whose jobs the registry of live workers changes (running ones are not waiting).
WAITING_OR_RUNNING = ("available", "scheduled", "running")
#: Columns the jobs list shows (the job page shows every column).
LIST_COLUMNS = (
    "id",
    "queue",
    "task",
    "status",
    "attempt",
    "max_attempts",
    "priority",
    "run_at",
    "created_at",
    "finished_at",
    "external_key",
    "tenant",
)
MESSAGE_CHARS = 160


@dataclasses.dataclass(frozen=True)
class JobFilter:
    """What the jobs page filters on; empty fields filter nothing."""

    queue: str = ""
    task: str = ""
    status: str = ""
    key: str = ""
    external_key: str = ""
    tenant: str = ""
    text: str = ""

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> JobFilter:
        values = {f.name: (params.get(f.name) or "").strip() for f in dataclasses.fields(cls)}
        if values["status"] not in ("", *STATUSES):
            values["status"] = ""
        if values["tenant"] and not values["tenant"].lstrip("-").isdigit():
            values["tenant"] = ""
        return cls(**values)

    def params(self) -> dict[str, str]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v}

    def where(
        self, jobs: sa.Table, now: sa.ColumnElement, in_flight: Sequence[int] = ()
    ) -> list[sa.ColumnElement]:
        """The filter's conditions; ``in_flight``: ids of jobs live workers run inside their
        claim's transaction (their rows say available): running, not waiting."""
        c = jobs.c
        held = c.id.in_(list(in_flight))
        found: list[sa.ColumnElement] = []
        for name in ("queue", "task", "external_key"):
            if getattr(self, name):
                found.append(c[name] == getattr(self, name))
        if self.key and "key" in c:  # the key column arrives with keyed jobs' migration
            found.append(c["key"] == self.key)
        if self.tenant:
            found.append(c.tenant == int(self.tenant))
        waiting = [c.status == Status.AVAILABLE, *([sa.not_(held)] if in_flight else [])]
        if self.status == "scheduled":
            found += [*waiting, c.run_at > now]
        elif self.status == Status.AVAILABLE:
            found += [*waiting, c.run_at <= now]
        elif self.status == Status.RUNNING and in_flight:
            held_running = sa.and_(c.status == Status.AVAILABLE, held)
            found.append(sa.or_(c.status == Status.RUNNING, held_running))
        elif self.status:
            found.append(c.status == self.status)
        if self.text:
            found.append(
                sa.or_(
                    sa.cast(c.payload, sa.Text()).contains(self.text, autoescape=True),
                    c.message.contains(self.text, autoescape=True),
                )
            )
        return found


def has_key_column(app: App) -> bool:
    return "key" in app.tables.jobs.c


def running_now(app: App, conn: sa.Connection, where: JobFilter) -> dict[int, running.RunningJob]:
    """The jobs live workers run now (see dbqueue/app/running.py), when the filter's status
    depends on them: a job run inside its claim's transaction is running, not waiting."""
    if where.status not in ("", *WAITING_OR_RUNNING):
        return {}
    return running.running_now(app.context, conn)


def list_jobs(
    app: App,
    conn: sa.Connection,
    where: JobFilter,
    before: int | None,
    runs: Mapping[int, running.RunningJob] | None = None,
) -> tuple[list[dict[str, Any]], int | None]:
    """One page of jobs, newest first, and the ``before`` id of the next page (None: last);
    ``runs`` (``running_now``): the jobs shown running, with the attempt running."""
    runs = runs or {}
    j = app.tables.jobs
    columns = [j.c[name] for name in LIST_COLUMNS]
    if has_key_column(app):
        columns.append(j.c["key"])
    columns.append(sa.func.substr(j.c.message, 1, MESSAGE_CHARS).label("message"))
    stmt = sa.select(*columns).where(*where.where(j, _now(app, conn), running.in_flight(runs)))
    if before is not None:
        stmt = stmt.where(j.c.id < before)
    rows = [
        dict(r._mapping) for r in conn.execute(stmt.order_by(j.c.id.desc()).limit(PAGE_SIZE + 1))
    ]
    rows = [runs[row["id"]].on(row) if row["id"] in runs else row for row in rows]
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    return rows, (rows[-1]["id"] if more and rows else None)


def count_jobs(
    app: App, conn: sa.Connection, where: JobFilter, in_flight: Sequence[int] = ()
) -> int:
    """How many jobs match, counting no further than COUNT_CAP + 1."""
    j = app.tables.jobs
    inner = sa.select(j.c.id).where(*where.where(j, _now(app, conn), in_flight))
    inner = inner.limit(COUNT_CAP + 1)
    return int(conn.execute(sa.select(sa.func.count()).select_from(inner.subquery())).scalar_one())


def matching_ids(app: App, conn: sa.Connection, where: JobFilter, limit: int) -> list[int]:
    """Ids of the jobs a bulk action on the filter acts on (at most ``limit``)."""
    j = app.tables.jobs
    held = running.in_flight(running_now(app, conn, where))
    stmt = sa.select(j.c.id).where(*where.where(j, _now(app, conn), held))
    stmt = stmt.order_by(j.c.id).limit(limit)
    return [int(i) for i in conn.execute(stmt).scalars()]


def throughput(
    app: App, conn: sa.Connection
) -> tuple[dt.datetime, dict[str, dict[str, list[int]]]]:
    """Jobs finished per BUCKET_MINUTES over the last hour: queue → {"succeeded": [...],
    "dead": [...]} (oldest bucket first), and the start of the first bucket."""
    j = app.tables.jobs
    end = conn.execute(sa.select(app.queue_engine(conn).sql.db_now())).scalar_one()
    start = end - dt.timedelta(minutes=BUCKETS * BUCKET_MINUTES)
    edges = [start + dt.timedelta(minutes=BUCKET_MINUTES * i) for i in range(BUCKETS + 1)]
    # One CASE picking the row's bucket (its arms stop at the first match), grouped on: a few
    # comparisons per row instead of a sum per bucket and status.
    bucket = sa.case(
        *((j.c.finished_at < edges[i + 1], i) for i in range(BUCKETS)), else_=BUCKETS - 1
    ).label("bucket")
    stmt = (
        sa.select(j.c.queue, j.c.status, bucket, sa.func.count().label("n"))
        .where(j.c.finished_at >= start, j.c.status.in_(("succeeded", "dead")))
        .group_by(j.c.queue, j.c.status, bucket)
    )
    found: dict[str, dict[str, list[int]]] = {}
    for queue, status, index, n in conn.execute(stmt):
        series = found.setdefault(queue, {"succeeded": [0] * BUCKETS, "dead": [0] * BUCKETS})
        series[status][min(int(index), BUCKETS - 1)] += int(n)
    return start, found


def _now(app: App, conn: sa.Connection) -> sa.ColumnElement:
    return app.queue_engine(conn).dialect.now()

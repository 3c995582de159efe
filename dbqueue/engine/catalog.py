"""Every statement dbqueue runs on its queue tables, named once: ``<table>_<what it does>``, a
one-line description each, the SQL built with SQLAlchemy Core.

The parts of the engine (``claims.py``, ``outcomes.py``, ``inserts.py`` …) decide which of these
run, in which transaction and in what order; none writes SQL of its own. Each builder takes the
queue's tables ``t`` and the database's Dialect ``d`` (what differs per database: the clock,
upserts, named locks, index hints), then its own arguments. A builder whose arguments are flags
and sizes is built once and compiled once (``Statements.__call__``): the hot path (claim,
complete, enqueue) reuses the same objects. How a claim is made exclusive is the strategy's: it
locks ``jobs_runnable`` its own way (``FOR UPDATE SKIP LOCKED``, the database's single write
lock, named locks around ``jobs_candidate_ids`` and ``jobs_mark_running``).

Sections: the runnable condition; jobs: claims, outcomes, inserts, reads, the morgue, purge;
key lines; unique keys; cancel requests; periodic ticks; queue-limit slots; the workers
registry; maintenance ticks; subscriptions.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from dbqueue.dialects import Dialect
from dbqueue.job import PUBLICATION_MARKER, ROW_FIELDS, Status
from dbqueue.schema.tables import QueueTables
from dbqueue.schema.types import UtcDateTime
from dbqueue.tasks.failures import MAX_KEPT_ERRORS

#: What a named lock expression is: the key read in the statement → the expression taking it.
LockExpression = Callable[[ColumnElement], ColumnElement]

# Columns a claim returns before the claim time; Job has one attribute for each.
_JOB_COLUMNS = ROW_FIELDS[:-1]


@functools.cache
def id_names(size: int) -> tuple[str, ...]:
    """Bind names of a list of ``size`` job ids: ``id_0`` … ``id_<size-1>``."""
    return tuple(f"id_{i}" for i in range(size))


@functools.cache
def result_names(size: int) -> tuple[str, ...]:
    """Bind names of a completion's results: ``result_0`` … (NULL for a job that has none)."""
    return tuple(f"result_{i}" for i in range(size))


def _id_list(t: QueueTables, size: int) -> ColumnElement:
    """``id IN (:id_0, …)``: a statement over ``size`` ids, compiled once per size (an expanding
    IN would be rendered again on every execution, and cannot be compiled in advance)."""
    id_type = t.jobs.c.id.type
    return t.jobs.c.id.in_([sa.bindparam(name, type_=id_type) for name in id_names(size)])


def _now(d: Dialect) -> ColumnElement:
    """The database clock, typed so that Python receives an aware UTC datetime."""
    return sa.type_coerce(d.now(), UtcDateTime())


def _job_columns(t: QueueTables) -> list[sa.Column]:
    return [t.jobs.c[name] for name in _JOB_COLUMNS]


def _claim_columns(t: QueueTables, d: Dialect) -> list[ColumnElement]:
    """The job columns as a claim reads them (the payload decoded by its type)."""
    return [
        d.payload_read(column) if column.name == "payload" else column for column in _job_columns(t)
    ]


def _bound(column: sa.Column, name: str | None = None) -> sa.BindParameter:
    return sa.bindparam(name or column.name, type_=column.type)


# ---- the runnable condition ---------------------------------------------------------------------
def runnable(
    t: QueueTables, d: Dialect, *, of_queue: bool = False, guard: bool = False, due: bool = True
) -> list[Any]:
    """Waiting and due: the one condition every claim derives from. ``of_queue``: of the queue
    ``:queue``; ``guard``: as a check next to ids already chosen (the planner must not use the
    claim index for it); ``due=False``: whatever the run_at (eager mode runs a job as its
    enqueue commits)."""
    j = t.jobs
    status = d.unindexed(j.c.status) if guard else j.c.status
    queue = [j.c.queue == _bound(j.c.queue)] if of_queue else []
    return [status == Status.AVAILABLE, *queue, *([j.c.run_at <= d.now()] if due else [])]


# ---- jobs: claims -------------------------------------------------------------------------------
def jobs_runnable(t: QueueTables, d: Dialect) -> sa.Select:
    """Runnable jobs of ``:queue`` in claim order, ``:limit`` of them, with the claim's time
    (the strategy adds its locking)."""
    return (
        sa.select(*_claim_columns(t, d), _now(d).label("started_at"))
        .where(*runnable(t, d, of_queue=True))
        .order_by(*d.claim_order(t.jobs))
        .limit(sa.bindparam("limit", type_=sa.Integer()))
    )


def jobs_runnable_of_task(
    t: QueueTables, d: Dialect, task: str, exclude: Sequence[int]
) -> sa.Select:
    """``jobs_runnable`` narrowed to one task, less the jobs this transaction already holds (a
    lock never hides a row from its holder): a batch handler's gathering."""
    stmt = jobs_runnable(t, d).where(t.jobs.c.task == task)
    return stmt.where(t.jobs.c.id.not_in(list(exclude))) if exclude else stmt


def jobs_candidate_ids(t: QueueTables, d: Dialect, of_task: bool) -> sa.Select:
    """Ids of runnable jobs of ``:queue`` in claim order, a page of them (``:limit`` from
    ``:offset``), unlocked; ``of_task``: of ``:task`` only. Lock-based claims lock from these."""
    j = t.jobs
    task = [j.c.task == _bound(j.c.task)] if of_task else []
    return (
        sa.select(j.c.id)
        .where(*runnable(t, d, of_queue=True), *task)
        .order_by(*d.claim_order(j))
        .limit(sa.bindparam("limit", type_=sa.Integer()))
        .offset(sa.bindparam("offset", type_=sa.Integer()))
    )


def jobs_candidate_ids_locked(
    t: QueueTables, d: Dialect, lock: LockExpression, of_task: bool
) -> sa.Select:
    """``jobs_candidate_ids`` with each id's named lock tried in the same statement: (id,
    taken). The lock sits in the select list over the LIMITed list (a derived table), so it is
    tried exactly once for each id returned."""
    listed = jobs_candidate_ids(t, d, of_task).subquery("candidates")
    return sa.select(listed.c.id, lock(listed.c.id))


def _running_values(t: QueueTables, now: ColumnElement) -> dict[str, Any]:
    """What marking a locked job ``running`` writes (one attempt more)."""
    j = t.jobs
    return {
        "status": Status.RUNNING,
        "attempt": j.c.attempt + 1,
        "started_at": now,
        "first_attempt_at": sa.func.coalesce(j.c.first_attempt_at, now),
        "worker_id": _bound(j.c.worker_id),
        "updated_at": now,
        "lease_until": sa.null(),  # its worker's lock, not a lease, says it is alive
    }


def jobs_lock_window_and_claim(t: QueueTables, d: Dialect, lock: LockExpression) -> sa.Select:
    """List a window of candidates, try each one's named lock and mark running those taken and
    still runnable, in one statement (databases that write in WITH): (id, taken, the claimed
    job's columns or NULLs). The window is a materialised CTE (its LIMIT applied before any
    lock is tried); the locks are tried in the select list of a second one, read in full by
    the final join, so each listed id's lock is tried exactly once."""
    j = t.jobs
    window = jobs_candidate_ids(t, d, False).cte("window").prefix_with("MATERIALIZED")
    unflushed = d.commit_unflushed()
    locks = (
        sa.select(
            window.c.id,
            lock(window.c.id).label("taken"),
            *([] if unflushed is None else [unflushed.label("unflushed")]),
        )
        .cte("locks")
        .prefix_with("MATERIALIZED")
    )
    now = d.now()
    claimed = (
        sa.update(j)
        .where(j.c.id.in_(sa.select(locks.c.id).where(locks.c.taken)), *runnable(t, d, guard=True))
        .values(_running_values(t, now))
        .returning(*_claim_columns(t, d), j.c.started_at)
        .cte("claimed")
    )
    columns = [claimed.c[name] for name in ROW_FIELDS]
    return sa.select(locks.c.id, locks.c.taken, *columns).select_from(
        locks.outerjoin(claimed, claimed.c.id == locks.c.id)
    )


def jobs_mark_running(
    t: QueueTables, d: Dialect, due: bool, returning: bool, size: int, unflushed: bool
) -> sa.Update:
    """Mark ``size`` jobs whose locks the caller holds ``running`` for ``:worker_id``, those
    still runnable (``due=False``: whatever their run_at), counting the attempt; returning
    their rows where the database can. ``unflushed``: the commit need not wait for the disk
    (``Dialect.commit_unflushed``, read once in the WHERE, before any row is written)."""
    j = t.jobs
    now = d.now()
    guard = runnable(t, d, guard=True, due=due)
    setting = d.commit_unflushed() if unflushed else None
    if setting is not None:
        guard.append(sa.select(setting).scalar_subquery().is_not(None))
    stmt = sa.update(j).where(_id_list(t, size), *guard).values(_running_values(t, now))
    return stmt.returning(*_claim_columns(t, d), j.c.started_at) if returning else stmt


def jobs_lease(t: QueueTables, d: Dialect, size: int, counted: bool) -> sa.Update:
    """Put ``size`` claimed jobs (``:id_0`` …) under a lease for ``:worker_id`` ending
    ``:lease_seconds`` from now, so that their handlers can run outside the claim's
    transaction. ``counted``: a committed claim already marked them running (only the lease is
    written); else the claim's transaction holds them, still available: they are marked
    running, the attempt counted, as a committed claim marks them."""
    j = t.jobs
    until = d.now_plus(sa.bindparam("lease_seconds", type_=sa.Float()))
    if counted:
        ours = [j.c.status == Status.RUNNING, j.c.worker_id == _bound(j.c.worker_id)]
        return sa.update(j).where(_id_list(t, size), *ours).values(lease_until=until)
    # Started when the claim read them (``:started``): what their outcome writes too.
    values = {**_running_values(t, _bound(j.c.started_at, "started")), "lease_until": until}
    values["updated_at"] = d.now()
    return sa.update(j).where(_id_list(t, size), j.c.status == Status.AVAILABLE).values(values)


def jobs_extend_leases(t: QueueTables, d: Dialect) -> sa.Update:
    """Move on the leases of the jobs ``:ids`` that still run under one of ``:workers`` (a
    worker's heartbeat)."""
    j = t.jobs
    until = d.now_plus(sa.bindparam("lease_seconds", type_=sa.Float()))
    return (
        sa.update(j)
        .where(
            d.in_list(j.c.id, "ids"),
            j.c.status == Status.RUNNING,
            j.c.lease_until.is_not(None),
            j.c.worker_id.in_(sa.bindparam("workers", expanding=True)),
        )
        .values(lease_until=until)
    )


def jobs_read_marked_running(t: QueueTables, d: Dialect, size: int) -> sa.Select:
    """Where UPDATE returns nothing: the ``size`` jobs ``jobs_mark_running`` just marked."""
    j = t.jobs
    return sa.select(*_claim_columns(t, d), j.c.started_at).where(
        _id_list(t, size), j.c.status == Status.RUNNING, j.c.worker_id == _bound(j.c.worker_id)
    )


def jobs_waiting_of(t: QueueTables, d: Dialect, ids: Sequence[int]) -> sa.Select:
    """These jobs if they still wait, whatever their run_at, in claim order, with the claim's
    time: eager mode's claim, locked by the strategy like ``jobs_runnable``."""
    j = t.jobs
    return (
        sa.select(*_claim_columns(t, d), _now(d).label("started_at"))
        .where(j.c.id.in_(list(ids)), *runnable(t, d, guard=True, due=False))
        .order_by(*d.claim_order(j))
    )


def _undo_claim(t: QueueTables, now: ColumnElement) -> list[tuple[Any, Any]]:
    """What undoing a committed claim writes, in order: MySQL evaluates SET left to right, so
    the columns that read ``attempt`` come before it changes."""
    j = t.jobs
    return [
        (j.c.first_attempt_at, sa.case((j.c.attempt <= 1, sa.null()), else_=j.c.first_attempt_at)),
        (j.c.started_at, j.c.previous_attempt_at),
        (j.c.status, Status.AVAILABLE),
        (j.c.attempt, j.c.attempt - 1),
        (j.c.worker_id, None),
        (j.c.updated_at, now),
    ]


def jobs_unclaim(
    t: QueueTables, d: Dialect, ids: Sequence[int], claimed_by: str | None
) -> sa.Update:
    """Undo a committed claim of jobs never started (a stopping worker, a rolled-back batch):
    available again, the attempt uncounted; ``claimed_by``: only rows that worker claimed."""
    j = t.jobs
    guard = [j.c.id.in_(list(ids)), j.c.status == Status.RUNNING]
    if claimed_by is not None:
        guard.append(j.c.worker_id == claimed_by)
    return sa.update(j).where(*guard).ordered_values(*_undo_claim(t, d.now()))


def jobs_row_of(t: QueueTables, d: Dialect, job_id: int) -> sa.Select:
    """One job's columns as a claim reads them, without the claim's time."""
    return sa.select(*_job_columns(t)).where(t.jobs.c.id == job_id)


def jobs_line_of(t: QueueTables, d: Dialect, job_id: int) -> sa.Select:
    """One job's (queue, key, key_seq): where it stands in its key's line."""
    j = t.jobs
    return sa.select(j.c.queue, j.c["key"], j.c.key_seq).where(j.c.id == job_id)


def jobs_set_aside(t: QueueTables, d: Dialect, job_id: int, message: str) -> sa.Update:
    """Mark dead, with ``message``, a waiting job whose row cannot make a Job."""
    j = t.jobs
    now = d.now()
    return (
        sa.update(j)
        .where(j.c.id == job_id, j.c.status == Status.AVAILABLE)
        .values(status=Status.DEAD, message=message, finished_at=now, updated_at=now)
    )


# ---- jobs: outcomes -----------------------------------------------------------------------------
def _complete(
    t: QueueTables,
    d: Dialect,
    fenced: bool,
    ids: ColumnElement,
    message: ColumnElement | None = None,
    result: ColumnElement | None = None,
) -> sa.Update:
    j = t.jobs
    now = d.now()
    started = _bound(j.c.started_at, "started")
    fence = [j.c.worker_id == _bound(j.c.worker_id, "claimed_by")] if fenced else []
    stmt = (
        sa.update(j)
        .where(ids, d.unindexed(j.c.status) == _bound(j.c.status, "expected_status"), *fence)
        .values(
            status=Status.SUCCEEDED,
            attempt=j.c.attempt + sa.bindparam("increment", type_=sa.Integer()),
            message=sa.null() if message is None else message,
            started_at=started,
            first_attempt_at=sa.func.coalesce(j.c.first_attempt_at, started),
            finished_at=now,
            updated_at=now,
            worker_id=_bound(j.c.worker_id),
        )
    )
    # Jobs that return nothing leave result alone (NULL: a job succeeds once).
    return stmt if result is None else stmt.values(result=result)


def jobs_complete(t: QueueTables, d: Dialect, fenced: bool, size: int) -> sa.Update:
    """Mark ``size`` jobs succeeded (``:id_0`` …) if the fence still holds (``:expected_status``,
    and ``:claimed_by`` when ``fenced``), counting ``:increment`` attempts."""
    return _complete(t, d, fenced, _id_list(t, size))


def jobs_complete_with_results(t: QueueTables, d: Dialect, fenced: bool, size: int) -> sa.Update:
    """``jobs_complete`` storing each job's result (``:result_0`` …; NULL for none)."""
    j = t.jobs
    arms = [
        (j.c.id == _bound(j.c.id, name), d.json_value(_bound(j.c.result, result)))
        for name, result in zip(id_names(size), result_names(size), strict=True)
    ]
    return _complete(t, d, fenced, _id_list(t, size), result=sa.case(*arms, else_=sa.null()))


def _case(
    t: QueueTables, values: Mapping[int, Any], type_: Any, wrap: Callable | None = None
) -> ColumnElement:
    """``CASE id WHEN … THEN :value … END`` (NULL for the other ids), or NULL."""
    if not values:
        return sa.null()
    arms = {}
    for job_id, value in values.items():
        bound = sa.bindparam(None, value, type_=type_)
        arms[job_id] = wrap(bound) if wrap is not None else bound
    return sa.case(arms, value=t.jobs.c.id, else_=sa.null())


def jobs_complete_with_messages(
    t: QueueTables,
    d: Dialect,
    fenced: bool,
    messages: Mapping[int, str],
    results: Mapping[int, Any],
) -> sa.Update:
    """``jobs_complete`` of the ids ``:ids`` storing messages (webhooks, the seed's workers)
    and results, one CASE arm per value."""
    j = t.jobs
    return _complete(
        t,
        d,
        fenced,
        d.in_list(j.c.id, "ids"),
        message=_case(t, messages, sa.Text()),
        result=_case(t, results, j.c.result.type, d.json_value),
    )


def jobs_succeeded_among(t: QueueTables, d: Dialect, ids: Sequence[int]) -> sa.Select:
    """Which of these jobs are succeeded."""
    j = t.jobs
    return sa.select(j.c.id).where(j.c.id.in_(list(ids)), j.c.status == Status.SUCCEEDED)


def _fenced(t: QueueTables, d: Dialect, job: Any, fence: Any) -> list[Any]:
    """The WHERE of an outcome written by ``fence``'s claim (``strategies.base.Fence``)."""
    j = t.jobs
    guard = [j.c.id == job.id, j.c.status == fence.status]
    if fence.claimed_by is not None:
        guard.append(j.c.worker_id == fence.claimed_by)
    if fence.same_attempt:
        guard.append(j.c.attempt == job.attempt - fence.attempt_increment)
    if fence.lease_expired:  # a heartbeat may have moved it on since the job was listed
        guard.append(j.c.lease_until < d.now())
    return guard


def jobs_fail(
    t: QueueTables,
    d: Dialect,
    job: Any,
    fence: Any,
    message: str | None,
    retry_in: float | None,
    error: str,
) -> sa.Update:
    """Record a failed attempt of a claimed job: available again after ``retry_in`` seconds,
    or dead (None); ``error`` (an object's JSON text) joins its list of errors."""
    j = t.jobs
    now = d.now()
    entry = sa.bindparam("error_entry", error, type_=sa.Text())
    values: dict[str, Any] = {
        "errors": d.json_list_append(j.c.errors, entry, MAX_KEPT_ERRORS),
        "attempt": j.c.attempt + fence.attempt_increment,
        "message": message,
        "started_at": job.started_at,
        "first_attempt_at": sa.func.coalesce(j.c.first_attempt_at, job.started_at),
        "previous_attempt_at": job.started_at,
        "previous_status": Status.FAILED,
        "previous_message": message,
        "updated_at": now,
        "worker_id": fence.worker_id,
    }
    if retry_in is None:
        values.update(status=Status.DEAD, finished_at=now)
    else:
        values.update(status=Status.AVAILABLE, run_at=d.now_plus(retry_in))
    return sa.update(j).where(*_fenced(t, d, job, fence)).values(values)


def jobs_cancel_running(
    t: QueueTables,
    d: Dialect,
    job: Any,
    fence: Any,
    message: str | None,
    requested_at: dt.datetime | None,
) -> sa.Update:
    """Record a running job stopped on request: cancelled, the attempt counted."""
    j = t.jobs
    now = d.now()
    return (
        sa.update(j)
        .where(*_fenced(t, d, job, fence))
        .values(
            status=Status.CANCELLED,
            attempt=j.c.attempt + fence.attempt_increment,
            message=message,
            started_at=job.started_at,
            first_attempt_at=sa.func.coalesce(j.c.first_attempt_at, job.started_at),
            finished_at=now,
            cancel_requested_at=now if requested_at is None else requested_at,
            updated_at=now,
            worker_id=fence.worker_id,
        )
    )


def jobs_announce_finished(t: QueueTables, d: Dialect) -> Any:
    """Tell the callers waiting on the ``:channel`` that jobs finished (``:message``), when the
    transaction commits; False where the database cannot push."""
    found = d.announcement()
    return False if found is None else found


def jobs_announce_runnable(t: QueueTables, d: Dialect) -> Any:
    """Wake the workers listening on the ``:channel`` for the queue ``:message`` (what the insert
    trigger sends), when the transaction commits; False where the database cannot push."""
    found = d.announcement()
    return False if found is None else found


# ---- jobs: inserts ------------------------------------------------------------------------------
def _with_times(t: QueueTables, d: Dialect, stmt: sa.Insert, timing: str) -> sa.Insert:
    """Where the DDL defaults cannot be the UTC clock, write it explicitly."""
    if not d.insert_sets_times:
        return stmt
    now = d.now()
    stmt = stmt.values(created_at=now, updated_at=now)
    return stmt.values(run_at=now) if timing == "now" else stmt


def jobs_insert(t: QueueTables, d: Dialect, timing: str) -> sa.Insert:
    """Insert jobs whose columns come from the parameters; ``timing`` "delay": run_at from the
    database clock plus ``:delay_seconds``."""
    stmt = _with_times(t, d, sa.insert(t.jobs), timing)
    if timing == "delay":
        stmt = stmt.values(run_at=d.now_plus(sa.bindparam("delay_seconds", type_=sa.Float())))
    return stmt


def jobs_insert_returning(t: QueueTables, d: Dialect, timing: str) -> sa.Insert:
    """``jobs_insert`` returning the new ids."""
    return jobs_insert(t, d, timing).returning(t.jobs.c.id)


def jobs_insert_one(
    t: QueueTables, d: Dialect, columns: tuple[str, ...], timing: str, returning: bool
) -> sa.Insert:
    """Insert one job setting these columns (precompiled: the one-job enqueue); returning its
    id where the driver's lastrowid does not give it."""
    j = t.jobs
    values = {name: _bound(j.c[name]) for name in columns if name != "delay_seconds"}
    stmt = jobs_insert(t, d, timing).values(values)
    return stmt.returning(j.c.id) if returning else stmt


def jobs_insert_rows(
    t: QueueTables, d: Dialect, columns: tuple[str, ...], timing: str, returning: bool, size: int
) -> sa.Insert:
    """Insert ``size`` jobs in one multi-row VALUES, parameters ``<column>__<row>``."""
    j = t.jobs
    now = d.now()
    times = {"created_at": now, "updated_at": now} if d.insert_sets_times else {}
    if timing == "now" and times:
        times["run_at"] = now
    rows = []
    for index in range(size):
        row: dict[str, Any] = {
            name: sa.bindparam(f"{name}__{index}", type_=j.c[name].type)
            for name in columns
            if name != "delay_seconds"
        }
        if timing == "delay":
            row["run_at"] = d.now_plus(sa.bindparam(f"delay_seconds__{index}", type_=sa.Float()))
        rows.append({**row, **times})
    stmt = sa.insert(j).values(rows)
    return stmt.returning(j.c.id) if returning else stmt


def jobs_insert_columnar(
    t: QueueTables, d: Dialect, columns: tuple[str, ...], timing: str
) -> sa.Insert | bool:
    """Insert jobs given as one list per column (PostgreSQL's unnest), returning their ids;
    False where the database has no such INSERT."""
    stmt = d.columnar_insert(t.jobs, columns)
    if stmt is None:
        return False
    return _with_times(t, d, stmt, timing).returning(t.jobs.c.id)


def jobs_insert_finished(
    t: QueueTables, d: Dialect, values: Mapping[str, Any], timing: str, message: str | None
) -> sa.Insert:
    """Insert a row finished from the start (a publication's own record)."""
    now = d.now()
    return (
        _with_times(t, d, sa.insert(t.jobs), timing)
        .values(dict(values))
        .values(status=Status.SUCCEEDED, message=message, finished_at=now)
    )


# ---- jobs: reads --------------------------------------------------------------------------------
def jobs_get(t: QueueTables, d: Dialect, job_id: int) -> sa.Select:
    """One job's whole row."""
    return sa.select(t.jobs).where(t.jobs.c.id == job_id)


def jobs_finish_state(t: QueueTables, d: Dialect, job_id: int) -> sa.Select:
    """What a caller waiting for a job reads: where it is, its result or last message."""
    j = t.jobs
    columns = ("id", "task", "queue", "status", "attempt", "max_attempts", "run_at")
    return sa.select(*(j.c[name] for name in columns), j.c.result, j.c.message, j.c.awaited).where(
        j.c.id == job_id
    )


def jobs_equivalent(
    t: QueueTables,
    d: Dialect,
    task: str,
    payload_hash: str,
    statuses: Iterable[str],
    filters: Mapping[str, Any],
) -> sa.Select:
    """Jobs of ``task`` with the same payload (by hash) in one of ``statuses``, the column
    ``filters`` equal (None: empty), oldest first."""
    j = t.jobs
    stmt = sa.select(j).where(
        j.c.task == task, j.c.payload_hash == payload_hash, j.c.status.in_(list(statuses))
    )
    for column, value in filters.items():
        stmt = stmt.where(j.c[column].is_(None) if value is None else j.c[column] == value)
    return stmt.order_by(j.c.id)


def jobs_stats(t: QueueTables, d: Dialect, in_flight: Sequence[int] = ()) -> sa.Select:
    """Per queue and status: how many; among the rows not ``in_flight``, how many scheduled and
    the oldest runnable's run_at; when ``in_flight`` (ids of jobs live workers run inside their
    claim's open transaction) is given, how many of them still say available."""
    j = t.jobs
    now = d.now()
    waiting = j.c.status == Status.AVAILABLE
    held = j.c.id.in_(list(in_flight))
    free = [sa.not_(held)] if in_flight else []
    scheduled = sa.case((sa.and_(waiting, j.c.run_at > now, *free), 1), else_=0)
    runnable_since = sa.case((sa.and_(*runnable(t, d), *free), j.c.run_at), else_=None)
    columns = [
        j.c.queue,
        j.c.status,
        sa.func.count().label("n"),
        sa.func.sum(scheduled).label("scheduled"),
        sa.type_coerce(sa.func.min(runnable_since), UtcDateTime()).label("oldest"),
    ]
    if in_flight:  # else no column: the scan evaluates nothing more
        running = sa.case((sa.and_(waiting, held), 1), else_=0)
        columns.append(sa.func.sum(running).label("in_flight"))
    return sa.select(*columns).group_by(j.c.queue, j.c.status)


def clock(t: QueueTables, d: Dialect) -> sa.Select:
    """The database's clock."""
    return sa.select(_now(d))


def jobs_states(t: QueueTables, d: Dialect, ids: Sequence[int]) -> sa.Select:
    """(id, committed status) of these jobs; never waits for a row lock."""
    j = t.jobs
    return sa.select(j.c.id, j.c.status).where(j.c.id.in_(list(ids)))


def jobs_running(t: QueueTables, d: Dialect, limit: int) -> sa.Select:
    """Jobs committed as ``running`` under a lock, oldest first (rescue looks for their dead
    workers: a free lock); a leased job's lease says whether its worker lives."""
    j = t.jobs
    return (
        sa.select(*_job_columns(t), j.c.started_at)
        .where(j.c.status == Status.RUNNING, j.c.lease_until.is_(None))
        .order_by(j.c.id)
        .limit(limit)
    )


def jobs_lease_expired(t: QueueTables, d: Dialect, limit: int) -> sa.Select:
    """Running jobs whose lease ended: their worker stopped heartbeating (rescue retries
    them), oldest first."""
    j = t.jobs
    return (
        sa.select(*_job_columns(t), j.c.started_at)
        .where(j.c.status == Status.RUNNING, j.c.lease_until < d.now())
        .order_by(j.c.id)
        .limit(limit)
    )


def jobs_runnable_queues(t: QueueTables, d: Dialect, waited: float) -> sa.Select:
    """Queues holding jobs runnable for at least ``waited`` seconds."""
    j = t.jobs
    return (
        sa.select(j.c.queue)
        .where(j.c.status == Status.AVAILABLE, j.c.run_at <= d.now_plus(-waited))
        .group_by(j.c.queue)
    )


def jobs_next_due(t: QueueTables, d: Dialect, queues: Sequence[str]) -> sa.Select:
    """The earliest future run_at of these queues' waiting jobs, and the clock."""
    j = t.jobs
    return sa.select(sa.type_coerce(sa.func.min(j.c.run_at), UtcDateTime()), _now(d)).where(
        j.c.status == Status.AVAILABLE, j.c.queue.in_(list(queues)), j.c.run_at > d.now()
    )


def jobs_attempt_states(t: QueueTables, d: Dialect, ids: Sequence[int]) -> sa.Select:
    """(id, status, attempt) of these jobs, by primary key: whether the jobs live workers
    report running still run the attempt reported."""
    j = t.jobs
    return sa.select(j.c.id, j.c.status, j.c.attempt).where(j.c.id.in_(list(ids)))


def jobs_of_publication(t: QueueTables, d: Dialect, publication_id: int) -> sa.Select:
    """A publication's deliveries and their dead-letter jobs (not its own record)."""
    j = t.jobs
    return (
        sa.select(j.c.id)
        .where(j.c.publication_id == publication_id, j.c.subscription_id != PUBLICATION_MARKER)
        .order_by(j.c.id)
    )


# ---- jobs: cancelling waiting jobs --------------------------------------------------------------
def jobs_waiting_unlocked(t: QueueTables, d: Dialect, ids: Sequence[int]) -> sa.Select:
    """Those of these jobs that wait and that no transaction holds (SKIP LOCKED)."""
    j = t.jobs
    return (
        sa.select(j.c.id)
        .where(j.c.id.in_(list(ids)), j.c.status.in_(Status.WAITING))
        .with_for_update(skip_locked=True)
    )


def jobs_cancel_waiting(t: QueueTables, d: Dialect, ids: Sequence[int], message: str) -> sa.Update:
    """Cancel those of these jobs that still wait (due, scheduled or blocked)."""
    j = t.jobs
    now = d.now()
    return (
        sa.update(j)
        .where(j.c.id.in_(list(ids)), d.unindexed(j.c.status).in_(Status.WAITING))
        .values(
            status=Status.CANCELLED,
            message=message,
            finished_at=now,
            cancel_requested_at=now,
            updated_at=now,
        )
    )


# ---- jobs: the morgue ---------------------------------------------------------------------------
def _dead(t: QueueTables, queue: str | None, task: str | None) -> ColumnElement:
    j = t.jobs
    where = [j.c.status == Status.DEAD]
    if queue is not None:
        where.append(j.c.queue == queue)
    if task is not None:
        where.append(j.c.task == task)
    return sa.and_(*where)


def jobs_dead(
    t: QueueTables, d: Dialect, queue: str | None, task: str | None, limit: int, order_by: str
) -> sa.Select:
    """Dead jobs of one queue/task (None: any): ``finished_at`` newest death first, ``id``
    oldest job first."""
    j = t.jobs
    order = (j.c.finished_at.desc(), j.c.id.desc()) if order_by == "finished_at" else (j.c.id,)
    return sa.select(j).where(_dead(t, queue, task)).order_by(*order).limit(limit)


def jobs_dead_ids_locked(t: QueueTables, d: Dialect, queue: str | None, task: str | None) -> Any:
    """Every dead job's id matching the filter, locked to the end of the transaction."""
    j = t.jobs
    return sa.select(j.c.id).where(_dead(t, queue, task)).order_by(j.c.id).with_for_update()


def jobs_dead_among_locked(t: QueueTables, d: Dialect, ids: Sequence[int]) -> sa.Select:
    """Those of these jobs that are dead, locked to the end of the transaction."""
    j = t.jobs
    return (
        sa.select(j.c.id).where(j.c.id.in_(list(ids)), j.c.status == Status.DEAD).with_for_update()
    )


def jobs_queues_of(t: QueueTables, d: Dialect, ids: Sequence[int]) -> sa.Select:
    """The queues these jobs are in, each once."""
    j = t.jobs
    return sa.select(j.c.queue).where(j.c.id.in_(list(ids))).distinct()


def jobs_delete_dead(t: QueueTables, d: Dialect, ids: Sequence[int]) -> sa.Delete:
    """Delete those of these jobs that are dead."""
    j = t.jobs
    return sa.delete(j).where(j.c.id.in_(list(ids)), j.c.status == Status.DEAD)


def jobs_requeue_dead(t: QueueTables, d: Dialect, ids: Sequence[int]) -> sa.Update:
    """Put dead jobs back to run now from their first attempt. ``previous_message`` is set
    first: MySQL evaluates SET left to right, so it copies ``message`` before that changes."""
    j = t.jobs
    now = d.now()
    return (
        sa.update(j)
        .where(j.c.id.in_(list(ids)), j.c.status == Status.DEAD)
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


# ---- jobs: purge --------------------------------------------------------------------------------
def jobs_purgeable_ids(t: QueueTables, d: Dialect, max_age_days: float, limit: int) -> sa.Select:
    """Up to ``limit`` finished jobs older than ``max_age_days``, oldest first (ids first, then
    DELETE by id: MySQL rejects LIMIT in an IN subquery)."""
    j = t.jobs
    cutoff = d.now_plus(-max_age_days * 86400)
    return (
        sa.select(j.c.id)
        .where(j.c.status.in_(Status.FINISHED), j.c.finished_at < cutoff)
        .order_by(j.c.finished_at)
        .limit(limit)
    )


def jobs_delete_finished(t: QueueTables, d: Dialect, ids: Sequence[int]) -> sa.Delete:
    """Delete those of these jobs that are finished."""
    j = t.jobs
    return sa.delete(j).where(j.c.id.in_(list(ids)), j.c.status.in_(Status.FINISHED))


# ---- key lines (keys.py) ------------------------------------------------------------------------
def _key_row(t: QueueTables) -> list[ColumnElement]:
    k = t.keys
    return [k.c.queue == _bound(k.c.queue), k.c["key"] == _bound(k.c["key"])]


def keys_add_places(t: QueueTables, d: Dialect, returning: str) -> sa.Insert:
    """Add ``:count`` places to the line of (``:queue``, ``:key``), creating its row, locking
    it to the end of the transaction; ``returning`` (where the database can): "last", the last
    place; "line", (queue, key, last place); "": nothing."""
    k = t.keys
    stmt = d.add_to_counter(k, "last_seq").values(
        queue=_bound(k.c.queue),
        key=_bound(k.c["key"]),
        last_seq=sa.bindparam("count", type_=sa.BigInteger()),
        created_at=d.now(),
    )
    if returning == "last":
        return stmt.returning(k.c.last_seq)
    return stmt.returning(k.c.queue, k.c["key"], k.c.last_seq) if returning else stmt


def keys_last_place(t: QueueTables, d: Dialect) -> sa.Select:
    """The last place of (``:queue``, ``:key``)'s line."""
    return sa.select(t.keys.c.last_seq).where(*_key_row(t))


def keys_last_places(t: QueueTables, d: Dialect, lines: Sequence[tuple[str, str]]) -> sa.Select:
    """(queue, key, last place) of these lines (and of others their queues and keys cross)."""
    k = t.keys
    return sa.select(k.c.queue, k.c["key"], k.c.last_seq).where(
        k.c["key"].in_({key for _, key in lines}), k.c.queue.in_({q for q, _ in lines})
    )


def keys_drop_if_last(t: QueueTables, d: Dialect) -> sa.Delete:
    """Delete the row of (``:queue``, ``:key``) if ``:seq`` is still its last place."""
    k = t.keys
    return sa.delete(k).where(
        *_key_row(t), k.c.last_seq == sa.bindparam("seq", type_=sa.BigInteger())
    )


def keys_lock(t: QueueTables, d: Dialect, queue: str, key: str) -> sa.Select:
    """Lock a key's row (enqueues and promotions of the key wait for this transaction)."""
    k = t.keys
    return sa.select(k.c.last_seq).where(k.c.queue == queue, k.c["key"] == key).with_for_update()


def keys_delete(t: QueueTables, d: Dialect, queue: str, key: str) -> sa.Delete:
    """Delete a key's row (its line is empty)."""
    k = t.keys
    return sa.delete(k).where(k.c.queue == queue, k.c["key"] == key)


def _line(t: QueueTables, queue: str, key: str) -> list[ColumnElement]:
    j = t.jobs
    return [j.c["key"] == key, j.c.queue == queue, j.c.key_seq.isnot(None)]


def jobs_head_of_line(t: QueueTables, d: Dialect, queue: str, key: str, other_than: int) -> Any:
    """A job other than ``other_than`` that heads the key's line (claimable or running)."""
    j = t.jobs
    return (
        sa.select(j.c.id)
        .where(
            *_line(t, queue, key),
            j.c.status.in_([Status.AVAILABLE, Status.RUNNING]),
            j.c.id != other_than,
        )
        .limit(1)
    )


def jobs_next_in_line(t: QueueTables, d: Dialect, queue: str, key: str) -> sa.Select:
    """The first blocked job of the key's line."""
    j = t.jobs
    return (
        sa.select(j.c.id)
        .where(*_line(t, queue, key), j.c.status == Status.BLOCKED)
        .order_by(j.c.key_seq)
        .limit(1)
    )


def jobs_unblock(t: QueueTables, d: Dialect, job_id: int) -> sa.Update:
    """A blocked job heads its line now: available."""
    j = t.jobs
    return (
        sa.update(j)
        .where(j.c.id == job_id, j.c.status == Status.BLOCKED)
        .values(status=Status.AVAILABLE, updated_at=d.now())
    )


def jobs_take_place(t: QueueTables, d: Dialect, job_id: int, place: int) -> sa.Update:
    """A job takes its place in its key's line: available at its head, blocked behind it."""
    j = t.jobs
    status = Status.AVAILABLE if place == 1 else Status.BLOCKED
    return sa.update(j).where(j.c.id == job_id).values(key_seq=place, status=status)


def jobs_admit_to_line(
    t: QueueTables, d: Dialect, job_id: int, place: int, undo_claim: bool
) -> sa.Update:
    """A keyed row written by plain SQL takes its place, met by a claim: blocked behind the
    head (``undo_claim``: its committed claim undone) unless it heads the line."""
    j = t.jobs
    values: list[tuple[Any, Any]] = [(j.c.key_seq, place)]
    if place != 1:
        values.append((j.c.status, Status.BLOCKED))
        if undo_claim:
            values += [
                (c, v) for c, v in _undo_claim(t, d.now()) if c.name not in ("status", "updated_at")
            ]
    return sa.update(j).where(j.c.id == job_id).ordered_values(*values)


def jobs_keyed_among(t: QueueTables, d: Dialect, ids: Sequence[int]) -> sa.Select:
    """(id, queue, key) of those of these jobs that have a key, by id."""
    j = t.jobs
    return (
        sa.select(j.c.id, j.c.queue, j.c["key"])
        .where(j.c.id.in_(list(ids)), j.c["key"].isnot(None))
        .order_by(j.c.id)
    )


def jobs_placed_among(t: QueueTables, d: Dialect, ids: Sequence[int]) -> sa.Select:
    """(id, queue, key, place) of those of these jobs that have a place in a key's line."""
    j = t.jobs
    return sa.select(j.c.id, j.c.queue, j.c["key"], j.c.key_seq).where(
        j.c.id.in_(list(ids)), j.c["key"].isnot(None), j.c.key_seq.isnot(None)
    )


def jobs_available_among(t: QueueTables, d: Dialect, ids: Sequence[int]) -> sa.Select:
    """Those of these jobs that are ``available``."""
    j = t.jobs
    return sa.select(j.c.id).where(j.c.id.in_(list(ids)), j.c.status == Status.AVAILABLE)


# ---- unique keys (unique.py) --------------------------------------------------------------------
def _unique_key(t: QueueTables, queue: str, key: str) -> list[ColumnElement]:
    u = t.unique
    return [u.c.queue == queue, u.c.unique_key == key]


def unique_take(t: QueueTables, d: Dialect, values: Mapping[str, Any], returning: bool) -> Any:
    """Insert a key's row naming its holder, or count a conflict on the row that exists (its
    lock taken either way); returning the holder where the rowcount cannot tell."""
    u = t.unique
    stmt = d.insert_or_count(u, "conflicts").values({**values, "created_at": d.now()})
    return stmt.returning(u.c.job_id) if returning else stmt


def unique_holder(t: QueueTables, d: Dialect, queue: str, key: str) -> sa.Select:
    """The job holding a key."""
    return sa.select(t.unique.c.job_id).where(*_unique_key(t, queue, key))


def unique_holder_locked(t: QueueTables, d: Dialect, queue: str, key: str) -> sa.Select:
    """A key's holder and follow-up, the key's row locked."""
    u = t.unique
    return sa.select(u.c.job_id, u.c.rerun_id).where(*_unique_key(t, queue, key)).with_for_update()


def unique_follow_up_locked(
    t: QueueTables, d: Dialect, queue: str, key: str, holder: int
) -> sa.Select:
    """The follow-up a holder leaves (id, due time), the key's row locked."""
    u = t.unique
    return (
        sa.select(u.c.rerun_id, u.c.rerun_at)
        .where(*_unique_key(t, queue, key), u.c.job_id == holder)
        .with_for_update()
    )


def unique_follow_up_due(t: QueueTables, d: Dialect, queue: str, key: str) -> sa.Select:
    """When a key's follow-up is due."""
    return sa.select(t.unique.c.rerun_at).where(*_unique_key(t, queue, key))


def unique_release(t: QueueTables, d: Dialect, queue: str, key: str, holder: int) -> sa.Delete:
    """Delete a key's row if ``holder`` holds it and no follow-up waits."""
    u = t.unique
    return sa.delete(u).where(
        *_unique_key(t, queue, key), u.c.job_id == holder, u.c.rerun_id.is_(None)
    )


def unique_set(
    t: QueueTables, d: Dialect, queue: str, key: str, values: Mapping[str, Any]
) -> sa.Update:
    """Change a key's holder, follow-up or follow-up's due time."""
    return sa.update(t.unique).where(*_unique_key(t, queue, key)).values(dict(values))


def jobs_unique_among(t: QueueTables, d: Dialect, ids: Sequence[int]) -> sa.Select:
    """(id, queue, unique_key, scored_payloads) of those of these jobs that have a unique key."""
    j = t.jobs
    return sa.select(j.c.id, j.c.queue, j.c.unique_key, j.c.scored_payloads).where(
        j.c.id.in_(list(ids)), j.c.unique_key.isnot(None)
    )


def jobs_finished_holders(t: QueueTables, d: Dialect, ids: Sequence[int]) -> sa.Select:
    """(queue, unique_key, id) of those of these jobs that hold a unique key and are finished."""
    j = t.jobs
    return sa.select(j.c.queue, j.c.unique_key, j.c.id).where(
        j.c.id.in_(list(ids)), j.c.unique_key.isnot(None), j.c.status.in_(Status.FINISHED)
    )


def jobs_lock(t: QueueTables, d: Dialect, job_id: int) -> sa.Select:
    """Lock a job's row (waiting for whoever holds it)."""
    j = t.jobs
    return sa.select(j.c.id).where(j.c.id == job_id).with_for_update()


def jobs_status(t: QueueTables, d: Dialect, job_id: int, lock: bool) -> sa.Select:
    """A job's status; ``lock``: its row locked, unless another transaction holds it (then no
    row: SKIP LOCKED)."""
    j = t.jobs
    stmt = sa.select(j.c.status).where(j.c.id == job_id)
    return stmt.with_for_update(skip_locked=True) if lock else stmt


def jobs_make_due(t: QueueTables, d: Dialect, job_id: int, run_at: Any) -> sa.Update:
    """A key's follow-up becomes its holder: due at ``run_at`` (None: now), if it waits."""
    j = t.jobs
    now = d.now()
    return (
        sa.update(j)
        .where(j.c.id == job_id, j.c.status.in_(Status.WAITING))
        .values(run_at=now if run_at is None else run_at, updated_at=now)
    )


def jobs_hold_back(t: QueueTables, d: Dialect, job_id: int, until: dt.datetime) -> sa.Update:
    """A follow-up waits for its holder: never due before ``until`` (the key hands it over)."""
    j = t.jobs
    return sa.update(j).where(j.c.id == job_id).values(run_at=until)


def jobs_payloads(t: QueueTables, d: Dialect, job_id: int) -> sa.Select:
    """A job's payload and its coalesced payloads."""
    j = t.jobs
    return sa.select(j.c.payload, j.c.scored_payloads).where(j.c.id == job_id)


def jobs_follow_up_of(t: QueueTables, d: Dialect, job_id: int) -> sa.Select:
    """A follow-up's coalesced payloads and status."""
    j = t.jobs
    return sa.select(j.c.scored_payloads, j.c.status).where(j.c.id == job_id)


def jobs_set_payloads(
    t: QueueTables, d: Dialect, job_id: int, payload: Any, payload_hash: str, scored: Any
) -> sa.Update:
    """A coalesced job's merged payloads (its newest as its payload)."""
    j = t.jobs
    return (
        sa.update(j)
        .where(j.c.id == job_id)
        .values(
            payload=payload, payload_hash=payload_hash, scored_payloads=scored, updated_at=d.now()
        )
    )


def jobs_take_payload(t: QueueTables, d: Dialect, job_id: int, values: Mapping[str, Any]) -> Any:
    """A waiting job takes an enqueue's payload (and run_at), if it still waits."""
    j = t.jobs
    return (
        sa.update(j)
        .where(j.c.id == job_id, j.c.status.in_(Status.WAITING))
        .values({**values, "updated_at": d.now()})
    )


def jobs_restart(t: QueueTables, d: Dialect, job_id: int, due_now: bool) -> sa.Update:
    """A job that took a dead job's payloads runs from its first attempt (``due_now``: now)."""
    j = t.jobs
    values: dict[str, Any] = {"attempt": 0}
    if due_now:
        values["run_at"] = d.now()
    return sa.update(j).where(j.c.id == job_id).values(values)


def jobs_cancel_merged(t: QueueTables, d: Dialect, dead_id: int, into: int) -> sa.Update:
    """A dead job requeued into a waiting one leaves the morgue, naming where its payloads went."""
    j = t.jobs
    return (
        sa.update(j)
        .where(j.c.id == dead_id, j.c.status == Status.DEAD)
        .values(
            status=Status.CANCELLED,
            message=f"requeued: its payloads merged into job {into}",
            updated_at=d.now(),
        )
    )


def jobs_drop_of(t: QueueTables, d: Dialect, job_id: int) -> sa.Select:
    """(queue, key, key_seq, status) of a job an enqueue inserted and now drops."""
    j = t.jobs
    return sa.select(j.c.queue, j.c["key"], j.c.key_seq, j.c.status).where(j.c.id == job_id)


def jobs_delete(t: QueueTables, d: Dialect, job_id: int) -> sa.Delete:
    """Delete one job (an enqueue's own, uncommitted insert)."""
    return sa.delete(t.jobs).where(t.jobs.c.id == job_id)


# ---- cancel requests (cancels.py) ---------------------------------------------------------------
# These take the requests table itself (``r``): the queue's ``<jobs>_cancels``, or the one in a
# side database (``Dialect.side_database_url``).
def cancels_add(r: sa.Table, d: Dialect) -> sa.Insert:
    """A request for ``:job_id`` (executemany), made now."""
    return sa.insert(r).values(requested_at=d.now())


def cancels_pending(r: sa.Table, d: Dialect, ids: Sequence[int]) -> sa.Select:
    """(job id, its first request's time) of those of these jobs that have requests."""
    return (
        sa.select(r.c.job_id, sa.type_coerce(sa.func.min(r.c.requested_at), UtcDateTime()))
        .where(r.c.job_id.in_(list(ids)))
        .group_by(r.c.job_id)
    )


def cancels_listed(r: sa.Table, d: Dialect, limit: int) -> sa.Select:
    """Job ids that have requests, oldest request first."""
    return sa.select(r.c.job_id).group_by(r.c.job_id).order_by(sa.func.min(r.c.id)).limit(limit)


def cancels_drop(r: sa.Table, d: Dialect, ids: Sequence[int]) -> sa.Delete:
    """Delete these jobs' requests (or, ``r`` the side database's marks, their marks)."""
    return sa.delete(r).where(r.c.job_id.in_(list(ids)))


def cancels_taken_among(r: sa.Table, d: Dialect, ids: Sequence[int]) -> sa.Select:
    """Those of these jobs whose requests a worker has taken (the side database's marks)."""
    return sa.select(r.c.job_id).where(r.c.job_id.in_(list(ids)))


def cancels_take(r: sa.Table, d: Dialect) -> sa.Insert:
    """Mark ``:job_id``'s requests taken by the worker stopping it (executemany)."""
    return sa.insert(r)


# ---- periodic ticks (periodic_ticks.py) ---------------------------------------------------------
def periodic_claim(t: QueueTables, d: Dialect) -> sa.Insert:
    """Insert the tick (``:name``, ``:tick``) unless it exists: rowcount 0, no error, when
    another worker's transaction has it."""
    return d.insert_unless_present(t.periodic)


def periodic_link(t: QueueTables, d: Dialect, name: str, tick: dt.datetime, job_id: int) -> Any:
    """Record which job a claimed tick enqueued."""
    p = t.periodic
    return sa.update(p).where(p.c.name == name, p.c.tick == tick).values(job_id=job_id)


def periodic_last_ticks(t: QueueTables, d: Dialect, names: Sequence[str] | None) -> sa.Select:
    """(schedule name, its latest tick), of these schedules (None: all)."""
    p = t.periodic
    stmt = sa.select(p.c.name, sa.type_coerce(sa.func.max(p.c.tick), UtcDateTime()))
    if names is not None:
        stmt = stmt.where(p.c.name.in_(list(names)))
    return stmt.group_by(p.c.name)


def periodic_status(t: QueueTables, d: Dialect) -> sa.Select:
    """Per schedule: its last tick, that tick's job and the job's status, how many ticks."""
    p, j = t.periodic, t.jobs
    latest = (
        sa.select(p.c.name, sa.func.max(p.c.tick).label("tick"), sa.func.count().label("ticks"))
        .group_by(p.c.name)
        .subquery()
    )
    return (
        sa.select(p.c.name, p.c.tick, p.c.job_id, latest.c.ticks, j.c.status)
        .join(latest, sa.and_(p.c.name == latest.c.name, p.c.tick == latest.c.tick))
        .outerjoin(j, j.c.id == p.c.job_id)
        .order_by(p.c.name)
    )


def periodic_old_ticks(
    t: QueueTables, d: Dialect, name: str, last: dt.datetime, max_age_days: float, limit: int
) -> sa.Select:
    """A schedule's ticks older than ``max_age_days`` and than its latest, oldest first."""
    p = t.periodic
    cutoff = d.now_plus(-max_age_days * 86400)
    return (
        sa.select(p.c.tick)
        .where(p.c.name == name, p.c.tick < last, p.c.tick < cutoff)
        .order_by(p.c.tick)
        .limit(limit)
    )


def periodic_delete(t: QueueTables, d: Dialect, name: str, ticks: Sequence[Any]) -> sa.Delete:
    """Delete these ticks of a schedule."""
    p = t.periodic
    return sa.delete(p).where(p.c.name == name, p.c.tick.in_(list(ticks)))


# ---- queue-limit slots (limit_slots.py) ---------------------------------------------------------
def slots_free(t: QueueTables, d: Dialect) -> sa.Select:
    """The lowest slot of ``:queue`` numbered below ``:slots`` that no job running under a
    lease holds (the strategy adds its locking: ``FOR UPDATE SKIP LOCKED``, the first slot
    nobody holds in a transaction). A leased job's claim committed: its slot row records it."""
    s, j = t.slots, t.jobs
    leased_holder = (
        sa.select(j.c.id)
        .where(j.c.id == s.c.job_id, j.c.status == Status.RUNNING, j.c.lease_until.is_not(None))
        .exists()
    )
    return (
        sa.select(s.c.slot)
        .where(
            s.c.queue == _bound(s.c.queue),
            s.c.slot < sa.bindparam("slots", type_=sa.Integer()),
            sa.not_(leased_holder),
        )
        .order_by(s.c.slot)
        .limit(1)
    )


def slots_numbers(t: QueueTables, d: Dialect, queue: str) -> sa.Select:
    """The slot numbers a queue has rows for."""
    s = t.slots
    return sa.select(s.c.slot).where(s.c.queue == queue)


def slots_add(t: QueueTables, d: Dialect) -> sa.Insert:
    """Create slot rows (``:queue``, ``:slot``; executemany)."""
    return sa.insert(t.slots)


def slots_record_holder(
    t: QueueTables, d: Dialect, queue: str, slot: int, job_id: int, worker_id: str
) -> sa.Update:
    """Write who holds a slot now (lock-based strategies, in their committed claim)."""
    s = t.slots
    return (
        sa.update(s)
        .where(s.c.queue == queue, s.c.slot == slot)
        .values(job_id=job_id, worker_id=worker_id, taken_at=d.now())
    )


def slots_rows(t: QueueTables, d: Dialect, queue: str | None) -> sa.Select:
    """The slot rows (of one queue), by queue and slot number."""
    s = t.slots
    stmt = sa.select(s).order_by(s.c.queue, s.c.slot)
    return stmt if queue is None else stmt.where(s.c.queue == queue)


# ---- the workers registry (worker_rows.py) ------------------------------------------------------
def workers_register(t: QueueTables, d: Dialect, values: Mapping[str, Any], ttl: float) -> Any:
    """Insert a worker's row, live for ``ttl`` seconds unless it beats."""
    now = d.now()
    row = {**values, "started_at": now, "heartbeat_at": now}
    return sa.insert(t.workers).values(expires_at=d.now_plus(ttl), **row)


def workers_beat(
    t: QueueTables, d: Dialect, worker_id: str, values: Mapping[str, Any], ttl: float
) -> sa.Update:
    """A worker's heartbeat: what it runs and has done, a new expiry."""
    w = t.workers
    return (
        sa.update(w)
        .where(w.c.id == worker_id)
        .values(heartbeat_at=d.now(), expires_at=d.now_plus(ttl), **values)
    )


def workers_delete(t: QueueTables, d: Dialect, worker_id: str) -> sa.Delete:
    """Delete a worker's row (it stops)."""
    return sa.delete(t.workers).where(t.workers.c.id == worker_id)


def workers_all(t: QueueTables, d: Dialect, include_gone: bool) -> sa.Select:
    """Every worker's row, oldest first, with ``alive`` and the clock it was judged by."""
    w = t.workers
    now = _now(d)
    alive = sa.case((w.c.expires_at >= now, True), else_=False).label("alive")
    stmt = sa.select(w, alive, now.label("now")).order_by(w.c.started_at, w.c.id)
    return stmt if include_gone else stmt.where(w.c.expires_at >= now)


def workers_probe(t: QueueTables, d: Dialect) -> sa.Select:
    """Nothing, from the registry's table (it exists, or the database says no such table)."""
    return sa.select(t.workers.c.id).limit(0)


def workers_gone(t: QueueTables, d: Dialect) -> sa.Select:
    """(id, name) of workers whose heartbeat expired."""
    w = t.workers
    return sa.select(w.c.id, w.c.name).where(w.c.expires_at < d.now())


def workers_delete_gone(t: QueueTables, d: Dialect, ids: Sequence[str]) -> sa.Delete:
    """Delete these workers' rows, if their heartbeat is still expired."""
    w = t.workers
    return sa.delete(w).where(w.c.id.in_(list(ids)), w.c.expires_at < d.now())


# ---- maintenance ticks (housekeeping.py) --------------------------------------------------------
def maintenance_claim_tick(
    t: QueueTables, d: Dialect, routine: str, tick: dt.datetime, worker_id: str
) -> sa.Update:
    """Compare-and-set: move the routine's last tick forward to ``tick`` (rowcount 1: this
    worker runs the tick). Every database re-checks the WHERE on the latest committed row
    after waiting for a concurrent updater, so exactly one worker meeting on a tick wins."""
    m = t.maintenance
    return (
        sa.update(m)
        .where(m.c.routine == routine, sa.or_(m.c.last_tick.is_(None), m.c.last_tick < tick))
        .values(
            last_tick=tick,
            started_at=d.now(),
            finished_at=None,
            worker_id=worker_id,
            runs=m.c.runs + 1,
            result=None,
        )
    )


def maintenance_record(
    t: QueueTables, d: Dialect, routine: str, tick: dt.datetime, result: str | None
) -> sa.Update:
    """Record what a routine's tick did."""
    m = t.maintenance
    return (
        sa.update(m)
        .where(m.c.routine == routine, m.c.last_tick == tick)
        .values(finished_at=d.now(), result=result)
    )


def maintenance_status(t: QueueTables, d: Dialect) -> sa.Select:
    """One row per routine."""
    return sa.select(t.maintenance).order_by(t.maintenance.c.routine)


# ---- subscriptions (pubsub/subscriptions.py) ----------------------------------------------------
def subscriptions_add(t: QueueTables, d: Dialect, values: Mapping[str, Any]) -> sa.Insert:
    """Insert a subscription."""
    return sa.insert(t.subscriptions).values(dict(values))


def subscriptions_get(t: QueueTables, d: Dialect, subscription_id: str) -> sa.Select:
    """One subscription."""
    s = t.subscriptions
    return sa.select(s).where(s.c.id == subscription_id)


def subscriptions_find(t: QueueTables, d: Dialect, topic: str | None, active: bool | None) -> Any:
    """The subscriptions (of one topic; only the active or inactive ones), by topic and id."""
    s = t.subscriptions
    stmt = sa.select(s).order_by(s.c.topic, s.c.id)
    if topic is not None:
        stmt = stmt.where(s.c.topic == topic)
    if active is not None:
        stmt = stmt.where(s.c.active == sa.true() if active else s.c.active == sa.false())
    return stmt


def subscriptions_update(
    t: QueueTables, d: Dialect, subscription_id: str, values: Mapping[str, Any]
) -> sa.Update:
    """Change a subscription."""
    s = t.subscriptions
    return sa.update(s).where(s.c.id == subscription_id).values(dict(values))


def subscriptions_delete(t: QueueTables, d: Dialect, subscription_id: str) -> sa.Delete:
    """Delete a subscription."""
    s = t.subscriptions
    return sa.delete(s).where(s.c.id == subscription_id)


def subscriptions_matching(
    t: QueueTables,
    d: Dialect,
    topic: str,
    tenant: int | None,
    business_group: str | None,
    webhooks_only: bool,
) -> sa.Select:
    """Ids of a topic's active subscriptions a publication for ``tenant`` and
    ``business_group`` reaches (an empty filter, NULL or '', matches everything), by id;
    ``webhooks_only``: those with a webhook url."""
    s = t.subscriptions

    def unfiltered_or(column: sa.ColumnElement, value: Any) -> sa.ColumnElement:
        no_filter = column.is_(None)
        if isinstance(column.type, sa.String):
            no_filter = sa.or_(no_filter, column == "")
        return no_filter if value is None else sa.or_(no_filter, column == value)

    stmt = (
        sa.select(s.c.id)
        .where(
            s.c.topic == topic,
            s.c.active == sa.true(),
            unfiltered_or(s.c.tenant, tenant),
            unfiltered_or(s.c.business_group, business_group),
        )
        .order_by(s.c.id)
    )
    return stmt.where(s.c.url.is_not(None), s.c.url != "") if webhooks_only else stmt

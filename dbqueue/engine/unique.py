"""Unique jobs: ``enqueue(..., unique_key=…, on_conflict=…)`` and the release of a key when its
holder finishes.

A key is held by a row of ``<jobs>_unique`` (primary key (queue, unique_key)) written in the
enqueue's own transaction, so the database itself decides between concurrent enqueues: the
second one waits for the first to commit or roll back (a rolled-back enqueue holds nothing),
on every database. The row names the holder; a holder that is finished (or gone) no longer
counts, so a key whose release was missed is taken over, never stuck.

Lock order, the same on every path, so that no enqueue and no worker wait for each other in a
circle: the holder's job row before the key's row where an enqueue may wait for a job row
(databases without SKIP LOCKED), else the key's row first and the job row only ever tried
with SKIP LOCKED (a row a worker's claim holds is running: nothing waits for it).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue.base import payload as payload_codec
from dbqueue.engine import catalog
from dbqueue.engine.inserts import Inserts
from dbqueue.engine.keys import KeyLines
from dbqueue.engine.records import NewJob
from dbqueue.engine.statements import Statements
from dbqueue.job import Status

ON_CONFLICT = ("skip", "replace", "rerun")
#: A coalescing task's enqueues: merge into the waiting job of the key, else rerun-like.
COALESCE = "coalesce"
#: run_at of a rerun's follow-up while the holder runs: never due until the holder finishes
#: and hands it the key (and its real run_at, kept in the key's row meanwhile).
HELD_BACK = dt.datetime(9999, 1, 1, tzinfo=dt.timezone.utc)
_ROUNDS = 5  # a key's holder changes under an enqueue at most this often before it gives up

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


class UniqueKeys:
    """Taking a unique key at enqueue, and what a finishing job does with its key: gives it
    up, or hands it to the follow-up a ``rerun`` enqueue left (which becomes due)."""

    def __init__(self, sql: Statements, keys: KeyLines, inserts: Inserts) -> None:
        self.sql = sql
        self.keys = keys
        self.inserts = inserts
        self.dialect = sql.dialect

    # ---- a finished holder --------------------------------------------------------------------
    def release_unique(self, conn: Connection, held: Sequence[tuple[str, str, int]]) -> None:
        """``held``: (queue, unique_key, job id) of finished jobs."""
        new = self.sql.new
        for queue, key, job_id in held:
            if conn.execute(new(catalog.unique_release, queue, key, job_id)).rowcount:
                continue
            row = conn.execute(new(catalog.unique_follow_up_locked, queue, key, job_id)).first()
            if row is not None:
                self._promote(conn, queue, key, row.rerun_id, row.rerun_at)

    def _promote(
        self, conn: Connection, queue: str, key: str, rerun_id: int, rerun_at: Any
    ) -> None:
        """The follow-up becomes the holder and is due at the time its enqueue asked for."""
        conn.execute(self.sql.new(catalog.jobs_make_due, rerun_id, rerun_at))
        values = {"job_id": rerun_id, "rerun_id": None, "rerun_at": None}
        conn.execute(self.sql.new(catalog.unique_set, queue, key, values))

    def release_finished(self, conn: Connection, ids: Sequence[int]) -> None:
        """Release the keys of those of ``ids`` that hold one and are finished now (paths that
        finish jobs by id: cancels, a batch completion that changed fewer rows than asked)."""
        if not ids:
            return
        rows = conn.execute(self.sql.new(catalog.jobs_finished_holders, ids)).all()
        self.release_unique(conn, [tuple(row) for row in rows])  # type: ignore[misc]

    # ---- an enqueue ---------------------------------------------------------------------------
    def insert_unique(self, conn: Connection, job: NewJob, on_conflict: str) -> int:
        """Insert ``job`` unless an unfinished job of its queue holds its ``unique_key``;
        return the id of the job that carries this enqueue (see the README's rules)."""
        assert job.unique_key is not None
        serial_reads = not self.dialect.supports_skip_locked and not self.dialect.single_writer
        new_id = self.inserts.insert(conn, job)
        for _ in range(_ROUNDS):
            if serial_reads:
                self._lock_holder_first(conn, job)
            holder = self._take_key(conn, job, new_id)
            if holder is None:
                return new_id
            found = self._resolve(conn, job, new_id, holder, on_conflict)
            if found is not None:
                return found
        raise RuntimeError(
            f"unique_key {job.unique_key!r} of queue {job.queue!r} changed holder "
            f"{_ROUNDS} times during one enqueue: try again"
        )

    def retake_keys(self, conn: Connection, ids: Sequence[int]) -> list[int]:
        """Of dead jobs about to be requeued, those that may run again: each with a unique key
        takes it back, unless another unfinished job of its queue holds it now (then the dead
        job stays dead: the holder does its work)."""
        keyed = conn.execute(self.sql.new(catalog.jobs_unique_among, ids)).all()
        refused = set()
        for job_id, queue, key, scored in keyed:
            job = NewJob(task="", payload=None, queue=queue, priority=0, max_attempts=1)
            job.unique_key = key
            holder = self._take_key(conn, job, int(job_id))
            if holder is None or int(holder.job_id) == job_id:
                continue
            refused.add(int(job_id))
            state = self._state(conn, int(holder.job_id))
            if state == FINISHED and holder.rerun_id is None:
                self._set_holder(conn, job, job_id=int(job_id), rerun_id=None, rerun_at=None)
                refused.discard(int(job_id))
            elif scored is not None:  # a coalesced job: merge into the job that waits
                self._merge_dead(conn, job, int(job_id), scored, holder, state)
        return [job_id for job_id in ids if job_id not in refused]

    def _merge_dead(
        self, conn: Connection, job: NewJob, dead_id: int, scored: Any, holder: Any, state: str
    ) -> None:
        """Lowkiq's rule for a dead job requeued while a job of its key waits: the payloads
        merge into the waiting one, which runs now from its first attempt; the dead job leaves
        the morgue (cancelled, naming the job that took its payloads)."""
        target, follow_up = int(holder.job_id), False
        if state != WAITING:
            rerun_id = holder.rerun_id
            if rerun_id is None or self._state(conn, int(rerun_id)) != WAITING:
                return  # the holder runs and nothing waits: the dead job stays dead
            target, follow_up = int(rerun_id), True
        self.merge_payloads(conn, target, scored)
        if follow_up:
            self._set_holder(conn, job, rerun_at=self.dialect.now())
        conn.execute(self.sql.new(catalog.jobs_restart, target, not follow_up))
        conn.execute(self.sql.new(catalog.jobs_cancel_merged, dead_id, target))

    def absorb_follow_up(self, conn: Connection, job: Any) -> None:
        """Lowkiq's rule for a failed attempt of a coalesced job: the payloads enqueued while
        it ran (its follow-up's) merge into it, and it keeps its run_at and attempt."""
        new = self.sql.new
        lock = catalog.unique_follow_up_locked
        row = conn.execute(new(lock, job.queue, job.unique_key, job.id)).first()
        if row is None or row.rerun_id is None:
            return
        follow = conn.execute(new(catalog.jobs_follow_up_of, row.rerun_id)).first()
        if follow is not None and follow.status in Status.WAITING:
            self.merge_payloads(conn, job.id, follow.scored_payloads)
            self._drop(conn, int(row.rerun_id))
        self._set_holder(conn, job, rerun_id=None, rerun_at=None)

    def _take_key(self, conn: Connection, job: NewJob, new_id: int) -> Any:
        """Insert the key's row for ``new_id``, or lock the existing one: None when the key
        was free, else the row (job_id, rerun_id)."""
        values = {"queue": job.queue, "unique_key": job.unique_key, "job_id": new_id}
        if self.dialect.upsert_rowcount_tells:
            if conn.execute(self.sql.new(catalog.unique_take, values, False)).rowcount == 1:
                return None
        elif conn.execute(self.sql.new(catalog.unique_take, values, True)).scalar_one() == new_id:
            return None
        holder = catalog.unique_holder_locked
        return conn.execute(self.sql.new(holder, job.queue, job.unique_key)).one()

    def _lock_holder_first(self, conn: Connection, job: NewJob) -> None:
        """Without SKIP LOCKED an enqueue may wait for the holder's row: take that lock before
        the key's (a worker finishing the holder holds its row, then asks for the key's)."""
        found = catalog.unique_holder
        holder = conn.execute(self.sql.new(found, job.queue, job.unique_key)).scalar()
        if holder is not None:
            conn.execute(self.sql.new(catalog.jobs_lock, holder)).all()

    def _state(self, conn: Connection, job_id: int) -> str:
        """waiting (its row now locked by this transaction), running, or finished (or gone).
        A row a claim holds is running, whatever its committed status says."""
        skip_locked = self.dialect.supports_skip_locked
        if skip_locked:
            status = conn.execute(self.sql.new(catalog.jobs_status, job_id, True)).scalar()
            if status is not None:
                return _state_of(status)
        status = conn.execute(self.sql.new(catalog.jobs_status, job_id, False)).scalar()
        if status is None:
            return FINISHED
        if status == Status.AVAILABLE and skip_locked:
            return RUNNING  # locked: a worker's claim holds it
        return _state_of(status)

    def _resolve(
        self, conn: Connection, job: NewJob, new_id: int, holder: Any, on_conflict: str
    ) -> int | None:
        """Apply ``on_conflict`` against the key's holder; None: the key changed hands (a
        stranded follow-up became the holder), look again."""
        holder_id, rerun_id = int(holder.job_id), holder.rerun_id
        state = self._state(conn, holder_id)
        if state == FINISHED:
            if rerun_id is not None and self._state(conn, rerun_id) == WAITING:
                # Its holder ended without handing it the key (a path that does not release).
                self._promote_stranded(conn, job, rerun_id)
                return None
            self._set_holder(conn, job, job_id=new_id, rerun_id=None, rerun_at=None)
            return new_id
        if state == WAITING and on_conflict == COALESCE:
            self.merge_payloads(conn, holder_id, job.scored_payloads)
        elif state == WAITING and on_conflict != "skip":
            self._swap(conn, holder_id, job)
        elif state == RUNNING and on_conflict in ("rerun", COALESCE):
            return self._follow_up(conn, job, new_id, rerun_id)
        self._drop(conn, new_id)
        return holder_id

    def _follow_up(self, conn: Connection, job: NewJob, new_id: int, rerun_id: Any) -> int:
        """The holder runs: one follow-up waits for it, however many reruns arrive."""
        if rerun_id is not None and self._state(conn, int(rerun_id)) == WAITING:
            if job.on_conflict == COALESCE:  # the follow-up keeps its own run_at (Lowkiq)
                self.merge_payloads(conn, int(rerun_id), job.scored_payloads)
            else:
                self._swap(conn, int(rerun_id), job, held_back=True)
                self._set_holder(conn, job, rerun_at=self._run_at(job))
            self._drop(conn, new_id)
            return int(rerun_id)
        conn.execute(self.sql.new(catalog.jobs_hold_back, new_id, HELD_BACK))
        self._set_holder(conn, job, rerun_id=new_id, rerun_at=self._run_at(job))
        return new_id

    def merge_payloads(self, conn: Connection, job_id: int, scored: Any) -> None:
        """Lowkiq's merge: the union of the payloads, ordered by score, an equal payload
        keeping its lowest score; ``payload`` becomes the newest (highest score). The job's
        run_at and attempt stay as they are."""
        row = conn.execute(self.sql.new(catalog.jobs_payloads, job_id)).one()
        merged = merge_scored(row.scored_payloads or [[0.0, row.payload]], _decoded(scored))
        newest = payload_codec.encode(merged[-1][1], max_bytes=None)
        encoded = payload_codec.encode(merged, max_bytes=None)
        stmt = catalog.jobs_set_payloads
        hashed = payload_codec.payload_hash(newest)
        conn.execute(self.sql.new(stmt, job_id, newest, hashed, encoded))

    def _promote_stranded(self, conn: Connection, job: NewJob, rerun_id: int) -> None:
        found = catalog.unique_follow_up_due
        row = conn.execute(self.sql.new(found, job.queue, job.unique_key)).one()
        self._promote(conn, job.queue, job.unique_key, rerun_id, row.rerun_at)  # type: ignore[arg-type]

    def _swap(self, conn: Connection, job_id: int, job: NewJob, held_back: bool = False) -> None:
        """A waiting job takes this enqueue's payload (and run_at, unless held back)."""
        row = job.values()
        values: dict[str, Any] = {"payload": row["payload"], "payload_hash": row["payload_hash"]}
        if not held_back:
            values["run_at"] = self._run_at(job)
        conn.execute(self.sql.new(catalog.jobs_take_payload, job_id, values))

    def _set_holder(self, conn: Connection, job: NewJob, **values: Any) -> None:
        stmt = catalog.unique_set
        conn.execute(self.sql.new(stmt, job.queue, job.unique_key, values))

    def _drop(self, conn: Connection, new_id: int) -> None:
        """The job this enqueue inserted before it knew of the holder (it never committed);
        one that took the head of its key's line gives that place up."""
        row = conn.execute(self.sql.new(catalog.jobs_drop_of, new_id)).one()
        conn.execute(self.sql.new(catalog.jobs_delete, new_id))
        if row.key_seq is not None and row.status == Status.AVAILABLE:
            self.keys.release_key(conn, row.queue, row.key, row.key_seq, new_id)

    def _run_at(self, job: NewJob) -> Any:
        if job.run_at is not None:
            return sa.bindparam(None, job.run_at, type_=self.sql.jobs.c.run_at.type)
        if job.delay:
            return self.dialect.now_plus(job.delay)
        return self.dialect.now()


def merge_scored(*lists: Any) -> list[list[Any]]:
    """[[score, payload], …] lists merged: one entry per distinct payload (compared by its
    canonical JSON) with its lowest score, sorted by score (ties keep their first order)."""
    best: dict[str, list[Any]] = {}
    for entries in lists:
        for score, payload in entries or ():
            canonical = payload_codec.encode(payload, max_bytes=None)
            found = best.get(canonical)
            if found is None or score < found[0]:
                best[canonical] = [score, payload]
    return sorted(best.values(), key=lambda entry: entry[0])


def _decoded(scored: Any) -> Any:
    return json.loads(scored) if isinstance(scored, str) else scored


def _state_of(status: str) -> str:
    if status in Status.WAITING:  # due, scheduled, or blocked behind its key's line
        return WAITING
    return RUNNING if status == Status.RUNNING else FINISHED

"""Outcomes of a claimed job: a batch completed in one UPDATE (precompiled per batch length, the
worker's hot path), a failure retried or dead, and the dead-letter job that carries a dead job's
payload to its dead handler."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue.base import payload as payload_codec
from dbqueue.engine.base import id_names as _id_names
from dbqueue.engine.records import FailResult, NewJob, truncate
from dbqueue.engine.unique import UniqueKeys
from dbqueue.job import Job, MalformedPayload, Status


@functools.cache
def _result_names(size: int) -> tuple[str, ...]:
    """Bind names of a completion's results: ``result_0`` … (NULL for a job that has none)."""
    return tuple(f"result_{i}" for i in range(size))


def _returns_of(
    done: Sequence[tuple[Job, str | None]],
) -> tuple[list[int], dict[int, Any], dict[int, Any], tuple[bool, bool, bool]]:
    """One pass over a completed batch: its ids, what its handlers returned (results by id,
    messages by id), and whether any job is awaited, keyed or holds a unique key (each of
    which costs a statement only when present)."""
    results: dict[int, Any] = {}
    messages: dict[int, Any] = {}
    ids: list[int] = []
    awaited = keyed = unique = False
    for job, value in done:
        ids.append(job.id)
        if value is not None:
            if type(value) is payload_codec.EncodedPayload:
                results[job.id] = value
            else:
                messages[job.id] = truncate(value)
        if job.awaited:
            awaited = True
        if job.key_seq is not None:
            keyed = True
        if job.unique_key:
            unique = True
    return ids, results, messages, (awaited, keyed, unique)


class Outcomes(UniqueKeys):
    """Extends Inserts: a dead job's dead-letter job is inserted in the same transaction; and
    UniqueKeys: a finished job's unique key is released in the same transaction."""

    def complete(
        self,
        conn: Connection,
        done: Sequence[tuple[Job, str | None]],
        *,
        attempt_increment: int,
        expected_status: str,
        worker_id: str,
        claimed_by: str | None = None,
    ) -> int:
        """Mark a batch succeeded with one UPDATE; returns how many rows it changed.

        Each job comes with what its handler returned, as stored: None (no result), an
        ``EncodedPayload`` (the JSON for the ``result`` column) or any other text (a message
        for the ``message`` column). Success clears ``message`` otherwise.
        ``claimed_by``: only rows this worker claimed (a committed claim's fence: a job that
        was rescued and claimed again since belongs to someone else)."""
        if not done:
            return 0
        ids, results, messages, follow_ups = _returns_of(done)
        params = {
            "expected_status": expected_status,
            "increment": attempt_increment,
            "started": done[0][0].started_at,
            "worker_id": worker_id,
        }
        fenced = claimed_by is not None
        if fenced:
            params["claimed_by"] = claimed_by
        awaited, keyed, unique = follow_ups
        # The mark and the keys it frees commit together, even where the outcome's statements
        # would each commit on their own: a crash between them would leave a finished job
        # holding its key's line, or its unique key, for ever.
        frees_keys = keyed or unique
        with self.dialect.statements_together(conn) if frees_keys else contextlib.nullcontext():
            changed = self._mark_succeeded(conn, ids, results, messages, params, fenced)
            if keyed:
                held = [job for job, _ in done if job.key_seq is not None]
                self._release_completed(conn, held, changed == len(ids))
            if unique:
                self._release_done(conn, [job for job, _ in done], changed)
        if awaited:  # a notice alone, after the mark, may commit on its own
            self.announce_finished(conn, [job.id for job, _ in done if job.awaited])
        return changed

    def _mark_succeeded(
        self,
        conn: Connection,
        ids: list[int],
        results: dict[int, Any],
        messages: dict[int, Any],
        params: dict[str, Any],
        fenced: bool,
    ) -> int:
        """``complete``'s UPDATE; returns how many rows it changed."""
        size = len(ids)
        if not messages:
            # One statement per batch length, ids as separate parameters: compiled in advance.
            # Results (rarer) get one of their own: a CASE arm per job, NULL for those without.
            if not results:
                stmt = self.statement(
                    f"complete:{fenced}:{size}",
                    lambda: self._build_complete(fenced, self._id_list(size)),
                )
            else:
                stmt = self.statement(
                    f"complete:results:{fenced}:{size}", lambda: self._build_results(fenced, size)
                )
                params.update(zip(_result_names(size), map(results.get, ids), strict=True))
            params.update(zip(_id_names(size), ids, strict=True))
            return self.compiled(stmt).rowcount(conn, params)
        # Messages (webhook deliveries, the seed's workers): one CASE arm per value.
        j = self.jobs
        params["ids"] = ids
        stmt = self._build_complete(
            fenced,
            self.dialect.in_list(j.c.id, "ids"),
            message=self._case(messages, sa.Text()),
            result=self._case(results, j.c.result.type, self.dialect.json_value),
        )
        return int(conn.execute(stmt, params).rowcount)

    def _release_done(self, conn: Connection, jobs: Sequence[Job], changed: int) -> None:
        """Release the unique keys of a completed batch (all of it, or what was ours)."""
        held = [(job.queue, job.unique_key, job.id) for job in jobs if job.unique_key]
        if not held or not changed:
            return
        if changed == len(jobs):
            self.release_unique(conn, held)
        else:
            self.release_finished(conn, [job_id for _, _, job_id in held])

    def _release_completed(self, conn: Connection, keyed: list[Job], all_changed: bool) -> None:
        """Release the keys of completed jobs; only of those the UPDATE changed, so a key is
        never released by a job whose completion did not happen (a double release would let
        two jobs of the key run)."""
        if not all_changed:
            j = self.jobs
            ids = [job.id for job in keyed]
            done = set(
                conn.execute(
                    sa.select(j.c.id).where(j.c.id.in_(ids), j.c.status == Status.SUCCEEDED)
                ).scalars()
            )
            keyed = [job for job in keyed if job.id in done]
        self.release_keys(conn, keyed)

    def _case(
        self,
        values: dict[int, Any],
        type_: Any,
        wrap: Callable[[sa.ColumnElement], sa.ColumnElement] | None = None,
    ) -> sa.ColumnElement:
        """``CASE id WHEN … THEN :value … END`` (NULL for the other ids), or NULL."""
        if not values:
            return sa.null()
        arms = {}
        for job_id, value in values.items():
            bound = sa.bindparam(None, value, type_=type_)
            arms[job_id] = wrap(bound) if wrap is not None else bound
        return sa.case(arms, value=self.jobs.c.id, else_=sa.null())

    def _build_results(self, fenced: bool, size: int) -> sa.Update:
        """The batch completion that also stores results: ``CASE WHEN id = :id_0 THEN
        :result_0 …`` over the same id parameters as the IN list."""
        j = self.jobs
        arms = [
            (
                j.c.id == sa.bindparam(name, type_=j.c.id.type),
                self.dialect.json_value(sa.bindparam(result, type_=j.c.result.type)),
            )
            for name, result in zip(_id_names(size), _result_names(size), strict=True)
        ]
        result = sa.case(*arms, else_=sa.null())
        return self._build_complete(fenced, self._id_list(size), result=result)

    def _build_complete(
        self,
        fenced: bool,
        ids: sa.ColumnElement,
        message: sa.ColumnElement | None = None,
        result: sa.ColumnElement | None = None,
    ) -> sa.Update:
        j = self.jobs
        now = self.dialect.now()
        started = sa.bindparam("started", type_=j.c.started_at.type)
        fence = [j.c.worker_id == sa.bindparam("claimed_by", type_=j.c.worker_id.type)]
        stmt = (
            sa.update(j)
            .where(
                ids,
                self.dialect.unindexed(j.c.status)
                == sa.bindparam("expected_status", type_=j.c.status.type),
                *(fence if fenced else []),
            )
            .values(
                status=Status.SUCCEEDED,
                attempt=j.c.attempt + sa.bindparam("increment", type_=sa.Integer()),
                message=sa.null() if message is None else message,
                started_at=started,
                first_attempt_at=sa.func.coalesce(j.c.first_attempt_at, started),
                finished_at=now,
                updated_at=now,
                worker_id=sa.bindparam("worker_id", type_=j.c.worker_id.type),
            )
        )
        # Jobs that return nothing leave result alone (NULL: a job succeeds once).
        return stmt if result is None else stmt.values(result=result)

    def fail(
        self,
        conn: Connection,
        job: Job,
        message: str,
        *,
        retry_in: float | None,
        attempt_increment: int,
        expected_status: str,
        worker_id: str,
        dead_letter: bool,
        claimed_by: str | None = None,
        same_attempt: bool = False,
        exclusive_key: bool = False,
    ) -> FailResult:
        """Record a failed attempt: retry after ``retry_in`` seconds, or mark the job dead.

        When the job dies and its task has a dead handler, a new job with the same payload, the
        dead flag and the live job's id is inserted in the same transaction (the seed's
        dead queue). ``claimed_by`` fences the UPDATE like ``complete()``'s; a job the UPDATE
        did not change (no longer ours, or already finished) gets no dead-letter job.
        ``same_attempt``: change the row only if it is still at the attempt that ran (a
        compare-and-set for outcomes written outside the claim's transaction, which another
        worker may have claimed again since). A keyed job that dies releases its key; one that
        will be retried keeps its place in its key's line, unless ``exclusive_key`` (its task's
        ``key_mode="exclusive"``): then it goes to the back of the line.
        """
        j = self.jobs
        message = truncate(message)
        now = self.dialect.now()
        values: dict[str, Any] = {
            "attempt": j.c.attempt + attempt_increment,
            "message": message,
            "started_at": job.started_at,
            "first_attempt_at": sa.func.coalesce(j.c.first_attempt_at, job.started_at),
            "previous_attempt_at": job.started_at,
            "previous_status": Status.FAILED,
            "previous_message": message,
            "updated_at": now,
            "worker_id": worker_id,
        }
        if retry_in is None:
            values.update(status=Status.DEAD, finished_at=now)
        else:
            values.update(status=Status.AVAILABLE, run_at=self.dialect.now_plus(retry_in))
        guard = [j.c.id == job.id, j.c.status == expected_status, *self._claimed_by(claimed_by)]
        if same_attempt:
            guard.append(j.c.attempt == job.attempt - attempt_increment)
        changed = conn.execute(sa.update(j).where(*guard).values(values)).rowcount
        if not changed:
            return FailResult(changed)
        if retry_in is None:
            return self._after_death(conn, job, changed, dead_letter)
        if job.key_seq is not None and exclusive_key:
            self.back_of_line(conn, job)
        if job.scored_payloads is not None and job.unique_key:
            self.absorb_follow_up(conn, job)
        return FailResult(changed)

    def _after_death(
        self, conn: Connection, job: Job, changed: int, dead_letter: bool
    ) -> FailResult:
        """What a job's death changes beside its row, in the same transaction: its key and
        unique key released, its waiting caller told, its dead-letter job inserted."""
        if job.key_seq is not None:
            self.release_keys(conn, [job])
        if job.awaited:
            self.announce_finished(conn, [job.id])
        self._release_done(conn, [job], changed)
        if dead_letter and not job.dead:
            return FailResult(changed, self.insert(conn, self.dead_letter_of(job)))
        return FailResult(changed)

    @staticmethod
    def dead_letter_of(job: Job) -> NewJob:
        stored = job.payload
        encoded = (
            payload_codec.EncodedPayload(stored.raw)
            if isinstance(stored, MalformedPayload)
            else payload_codec.encode(stored, max_bytes=None)
        )
        return NewJob(
            task=job.task,
            payload=encoded,
            queue=job.queue,
            priority=job.priority,
            max_attempts=job.max_attempts,
            external_key=job.external_key,
            origin=job.origin,
            destination=job.destination,
            tenant=job.tenant,
            business_group=job.business_group,
            publication_id=job.publication_id,
            subscription_id=job.subscription_id,
            dead=True,
            live_id=job.id,
        )

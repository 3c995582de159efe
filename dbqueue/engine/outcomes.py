"""Outcomes of a claimed job: a batch completed in one UPDATE (precompiled per batch length, the
worker's hot path), a failure retried or dead, and what either changes beside the job's row in
the same transaction: its key, its unique key, its waiting caller, its dead-letter job. Every
outcome is fenced (``Fence``): it changes the row only if the claim that ran it still owns it."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection

from dbqueue.base import payload as payload_codec
from dbqueue.engine import catalog
from dbqueue.engine.catalog import id_names, result_names
from dbqueue.engine.inserts import Inserts
from dbqueue.engine.keys import KeyLines
from dbqueue.engine.records import FailResult, NewJob, truncate
from dbqueue.engine.statements import Statements
from dbqueue.engine.unique import UniqueKeys
from dbqueue.job import Job, MalformedPayload
from dbqueue.strategies.base import Fence
from dbqueue.tasks.failures import AttemptError
from dbqueue.tasks.retry import Failure


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


class Outcomes:
    def __init__(
        self, sql: Statements, keys: KeyLines, unique: UniqueKeys, inserts: Inserts
    ) -> None:
        self.sql = sql
        self.keys = keys
        self.unique = unique
        self.inserts = inserts
        self.dialect = sql.dialect

    def complete(
        self, conn: Connection, done: Sequence[tuple[Job, str | None]], fence: Fence
    ) -> int:
        """Mark a batch succeeded with one UPDATE; returns how many rows it changed.

        Each job comes with what its handler returned, as stored: None (no result), an
        ``EncodedPayload`` (the JSON for the ``result`` column) or any other text (a message
        for the ``message`` column). Success clears ``message`` otherwise."""
        if not done:
            return 0
        ids, results, messages, follow_ups = _returns_of(done)
        params = {
            "expected_status": fence.status,
            "increment": fence.attempt_increment,
            "started": done[0][0].started_at,
            "worker_id": fence.worker_id,
        }
        fenced = fence.claimed_by is not None
        if fenced:
            params["claimed_by"] = fence.claimed_by
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
            self.sql.announce_finished(conn, [job.id for job, _ in done if job.awaited])
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
                stmt = self.sql(catalog.jobs_complete, fenced, size)
            else:
                stmt = self.sql(catalog.jobs_complete_with_results, fenced, size)
                params.update(zip(result_names(size), map(results.get, ids), strict=True))
            params.update(zip(id_names(size), ids, strict=True))
            return self.sql.compiled(stmt).rowcount(conn, params)
        # Messages (webhook deliveries, the seed's workers): one CASE arm per value.
        params["ids"] = ids
        stmt = self.sql.new(catalog.jobs_complete_with_messages, fenced, messages, results)
        return int(conn.execute(stmt, params).rowcount)

    def _release_done(self, conn: Connection, jobs: Sequence[Job], changed: int) -> None:
        """Release the unique keys of a completed batch (all of it, or what was ours)."""
        held = [(job.queue, job.unique_key, job.id) for job in jobs if job.unique_key]
        if not held or not changed:
            return
        if changed == len(jobs):
            self.unique.release_unique(conn, held)  # type: ignore[arg-type]
        else:
            self.unique.release_finished(conn, [job_id for _, _, job_id in held])

    def _release_completed(self, conn: Connection, keyed: list[Job], all_changed: bool) -> None:
        """Release the keys of completed jobs; only of those the UPDATE changed, so a key is
        never released by a job whose completion did not happen (a double release would let
        two jobs of the key run)."""
        if not all_changed:
            ids = [job.id for job in keyed]
            done = set(conn.execute(self.sql.new(catalog.jobs_succeeded_among, ids)).scalars())
            keyed = [job for job in keyed if job.id in done]
        self.keys.release_keys(conn, keyed)

    def fail(self, conn: Connection, job: Job, fence: Fence, failure: Failure) -> FailResult:
        """Record a failed attempt: retry after ``failure.retry_in`` seconds, or mark the job
        dead.

        When the job dies and its task has a dead handler, a new job with the same payload, the
        dead flag and the live job's id is inserted in the same transaction (the seed's
        dead queue). A job the UPDATE did not change (no longer this claim's, or already
        finished) gets no dead-letter job. A keyed job that dies releases its key; one that
        will be retried keeps its place in its key's line, unless ``failure.exclusive_key``
        (its task's ``key_mode="exclusive"``): then it goes to the back of the line.
        """
        message = truncate(failure.message)
        retry_in = failure.retry_in
        error = (failure.error or AttemptError(failure.message)).entry(job.attempt)
        stmt = self.sql.new(catalog.jobs_fail, job, fence, message, retry_in, error)
        changed = conn.execute(stmt).rowcount
        if not changed:
            return FailResult(changed)
        if retry_in is None:
            return self._after_death(conn, job, changed, failure.dead_letter)
        if job.key_seq is not None and failure.exclusive_key:
            self.keys.back_of_line(conn, job)
        if job.scored_payloads is not None and job.unique_key:
            self.unique.absorb_follow_up(conn, job)
        return FailResult(changed)

    def _after_death(
        self, conn: Connection, job: Job, changed: int, dead_letter: bool
    ) -> FailResult:
        """What a job's death changes beside its row, in the same transaction: its key and
        unique key released, its waiting caller told, its dead-letter job inserted."""
        if job.key_seq is not None:
            self.keys.release_keys(conn, [job])
        if job.awaited:
            self.sql.announce_finished(conn, [job.id])
        self._release_done(conn, [job], changed)
        if dead_letter and not job.dead:
            return FailResult(changed, self.inserts.insert(conn, dead_letter_of(job)))
        return FailResult(changed)


def dead_letter_of(job: Job) -> NewJob:
    """The job that carries a dead job's payload to its dead handler."""
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

"""Keys: jobs of one queue sharing a key run one at a time, in line order.

A key's jobs form a line, numbered by ``key_seq``. Only the head of the line is in the claimable
set (``available``, or ``running``); the others are ``blocked``, outside the claim index's range,
so a long line behind one busy key costs the claims of everything else nothing (the "``NOT
EXISTS`` at claim time" designs slow down as the line grows). The busy-keys table has a row per
(queue, key) with unfinished jobs; ``last_seq`` is the place of the latest.

- Enqueue adds ``n`` to ``last_seq`` with an upsert, in the enqueue's transaction: its row lock
  orders concurrent enqueues of the key (the second waits for the first to commit or roll
  back), and a row the upsert creates means the key was idle: the first new job heads the line.
- The head's end (succeeded, dead, cancelled; in ``exclusive`` mode also a failed attempt)
  releases the key in the same transaction: the row is deleted if no job joined the line since
  (``last_seq`` is still the head's place), else the next blocked job becomes ``available``.
- A job that is rescued or given back stays the head: its key is free again as soon as the job
  is claimable again — no timer is involved.
- A keyed row inserted by plain SQL (``key`` set, ``key_seq`` NULL) takes its place when a
  claim first meets it, in the claim's transaction (``admit``).

Every transition that changes which job of a key is claimable takes the key's row lock first
and holds it to its commit, so promotion, enqueue and cancellation of one key are serialised:
where a lock-based claim or outcome lets each statement commit on its own, the transition's
statements are still one transaction (``Dialect.statements_together``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue.engine.base import EngineBase
from dbqueue.job import Job, Status

#: Keys per multi-row upsert (4 parameters each, far below every driver's limit).
_UPSERT_ROWS = 2_000


class Keys(EngineBase):
    def take_places(self, conn: Connection, queue: str, key: str, count: int) -> int:
        """Add ``count`` places to the key's line; the last one's number. The places are
        ``last - count + 1 … last``; the key was idle iff ``last == count``."""
        params = {"queue": queue, "key": key, "count": count}
        if self.dialect.counter_returned:
            stmt = self.statement(
                "keys:place:returning",
                lambda: self._build_place().returning(self.tables.keys.c.last_seq),
            )
            return int(self.compiled(stmt).raw_rows(conn, params)[0][0])
        stmt = self.statement("keys:place", self._build_place)
        self.compiled(stmt).rowcount(conn, params)
        read = self.statement("keys:last", self._build_last)
        return int(self.compiled(read).raw_rows(conn, params)[0][0])

    def _build_place(self) -> sa.Insert:
        k = self.tables.keys
        return self.dialect.add_to_counter(k, "last_seq").values(
            queue=sa.bindparam("queue", type_=k.c.queue.type),
            key=sa.bindparam("key", type_=k.c["key"].type),
            last_seq=sa.bindparam("count", type_=sa.BigInteger()),
            created_at=self.dialect.now(),
        )

    def _build_last(self) -> sa.Select:
        k = self.tables.keys
        return sa.select(k.c.last_seq).where(*self._key_row())

    def _key_row(self) -> list[sa.ColumnElement]:
        k = self.tables.keys
        return [
            k.c.queue == sa.bindparam("queue", type_=k.c.queue.type),
            k.c["key"] == sa.bindparam("key", type_=k.c["key"].type),
        ]

    def places_of(self, conn: Connection, lines: Sequence[tuple[str, str]]) -> list[int]:
        """For new jobs given as (queue, key), in enqueue order: each one's place in its key's
        line (1: it heads the line, it is claimable). Keys are taken in sorted order, so two
        transactions enqueueing the same keys wait for each other instead of deadlocking."""
        counts: dict[tuple[str, str], int] = {}
        for line in lines:
            counts[line] = counts.get(line, 0) + 1
        if len(counts) == 1:
            (((queue, key), count),) = counts.items()
            last = {(queue, key): self.take_places(conn, queue, key, count)}
        else:
            last = self._take_many(conn, counts)
        next_place = {line: last[line] - count + 1 for line, count in counts.items()}
        places = []
        for line in lines:
            places.append(next_place[line])
            next_place[line] += 1
        return places

    def _take_many(
        self, conn: Connection, counts: dict[tuple[str, str], int]
    ) -> dict[tuple[str, str], int]:
        """``take_places`` for many keys with one multi-row upsert per chunk, in sorted order."""
        k = self.tables.keys
        found: dict[tuple[str, str], int] = {}
        lines = sorted(counts)
        # executemany of the one-row statement (compiled once): SQLAlchemy sends it as
        # multi-row VALUES, in this order, with RETURNING where the database has it.
        for first in range(0, len(lines), _UPSERT_ROWS):
            chunk = lines[first : first + _UPSERT_ROWS]
            rows = [{"queue": q, "key": key, "count": counts[(q, key)]} for q, key in chunk]
            if self.dialect.counter_returned:
                stmt = self.statement(
                    "keys:place_many:returning",
                    lambda: self._build_place().returning(k.c.queue, k.c["key"], k.c.last_seq),
                )
                result = conn.execute(stmt, rows)
            else:
                conn.execute(self.statement("keys:place", self._build_place), rows)
                result = conn.execute(
                    sa.select(k.c.queue, k.c["key"], k.c.last_seq).where(
                        k.c["key"].in_({key for _, key in chunk}),
                        k.c.queue.in_({q for q, _ in chunk}),
                    )
                )
            found.update(((q, key), int(last)) for q, key, last in result)
        return found

    # ---- the head's end -----------------------------------------------------------------------
    def release_keys(self, conn: Connection, jobs: Iterable[Job]) -> None:
        """Release the keys these jobs (heads of their lines) held, in sorted (queue, key)
        order: the order an enqueue of many keys takes their rows in (``places_of``), so the
        two wait for each other instead of deadlocking. (One DELETE for all the idle keys
        locked its rows in the order the database found them, and deadlocked with such an
        enqueue.)"""
        heads = [job for job in jobs if job.key is not None and job.key_seq is not None]
        heads.sort(key=lambda job: (job.queue, job.key))
        for job in heads:
            self.release_key(conn, job.queue, job.key, job.key_seq, job.id)  # type: ignore[arg-type]

    def release_key(
        self, conn: Connection, queue: str, key: str, seq: int, job_id: int
    ) -> int | None:
        """The key's head (job ``job_id``, place ``seq``) has ended: delete the key's row if no
        job joined the line since, else make the next blocked job available; its id, or None."""
        params = {"queue": queue, "key": key, "seq": seq}
        drop = self.statement("keys:drop_if_last", self._build_drop_if_last)
        if self.compiled(drop).rowcount(conn, params):
            return None  # the common case: nobody waits
        return self._promote_next(conn, queue, key, job_id)

    def _promote_next(self, conn: Connection, queue: str, key: str, job_id: int) -> int | None:
        """Someone joined the line of a head that ended: make the next blocked job available
        (or delete the key's row if every one was cancelled); its id, or None."""
        # The row lock is held to the end even where the outcome's statements would each
        # commit on their own: a job joining between the look and the delete would be lost.
        with self.dialect.statements_together(conn):
            return self._promote_next_locked(conn, queue, key, job_id)

    def _promote_next_locked(
        self, conn: Connection, queue: str, key: str, job_id: int
    ) -> int | None:
        k, j = self.tables.keys, self.jobs
        where = [k.c.queue == queue, k.c["key"] == key]
        # Someone joined the line: lock the key's row (enqueues of the key now wait), then look.
        if conn.execute(sa.select(k.c.last_seq).where(*where).with_for_update()).first() is None:
            return None
        line = [j.c["key"] == key, j.c.queue == queue, j.c.key_seq.isnot(None)]
        head = conn.execute(
            sa.select(j.c.id)
            .where(*line, j.c.status.in_([Status.AVAILABLE, Status.RUNNING]), j.c.id != job_id)
            .limit(1)
        ).first()
        if head is not None:
            return None  # another job heads the line: never promote a second one
        while True:
            found = conn.execute(
                sa.select(j.c.id)
                .where(*line, j.c.status == Status.BLOCKED)
                .order_by(j.c.key_seq)
                .limit(1)
            ).first()
            if found is None:
                conn.execute(sa.delete(k).where(*where))
                return None
            promoted = conn.execute(
                sa.update(j)
                .where(j.c.id == found[0], j.c.status == Status.BLOCKED)
                .values(status=Status.AVAILABLE, updated_at=self.dialect.now())
            ).rowcount
            if promoted:
                return int(found[0])

    def _build_drop_if_last(self) -> sa.Delete:
        k = self.tables.keys
        return sa.delete(k).where(
            *self._key_row(), k.c.last_seq == sa.bindparam("seq", type_=sa.BigInteger())
        )

    def back_of_line(self, conn: Connection, job: Job) -> None:
        """``exclusive`` mode: a failed attempt gives up the key and joins the back of its
        line (it heads it again at once if nobody waits)."""
        assert job.key is not None and job.key_seq is not None
        j = self.jobs
        with self.dialect.statements_together(conn):  # as admit: place and row together
            self.release_key(conn, job.queue, job.key, job.key_seq, job.id)
            place = self.take_places(conn, job.queue, job.key, 1)
            conn.execute(
                sa.update(j)
                .where(j.c.id == job.id)
                .values(key_seq=place, status=Status.AVAILABLE if place == 1 else Status.BLOCKED)
            )

    # ---- rows that have no place yet ----------------------------------------------------------
    def admit(self, conn: Connection, jobs: list[Job]) -> list[Job]:
        """Give claimed keyed jobs that have no place (rows inserted by plain SQL) their place,
        in the claim's transaction; returns the jobs that may run (those heading their line)."""
        if all(job.key is None or job.key_seq is not None for job in jobs):
            return jobs
        # Keys in sorted order, as an enqueue takes them (a stable sort: a key's own jobs keep
        # their claim order).
        placeless = [job for job in jobs if job.key is not None and job.key_seq is None]
        for job in sorted(placeless, key=lambda job: (job.queue, job.key)):
            assert job.key is not None
            # The place and the row's key_seq commit together: the key's row stays locked
            # until the row is in the line, where the head's end looks for who is behind it.
            with self.dialect.statements_together(conn):
                job.key_seq = self.take_places(conn, job.queue, job.key, 1)
                self._place(conn, job)
        waiting = {id(job) for job in placeless if job.key_seq != 1}
        return [job for job in jobs if id(job) not in waiting]

    def _place(self, conn: Connection, job: Job) -> None:
        j = self.jobs
        values: dict[Any, Any] = {j.c.key_seq: job.key_seq}
        if job.key_seq != 1:
            values[j.c.status] = Status.BLOCKED
            if job.status == Status.RUNNING:  # a committed claim: undo it, as release_claims
                values.update(
                    {
                        j.c.first_attempt_at: sa.case(
                            (j.c.attempt <= 1, sa.null()), else_=j.c.first_attempt_at
                        ),
                        j.c.started_at: j.c.previous_attempt_at,
                        j.c.attempt: j.c.attempt - 1,
                        j.c.worker_id: None,
                    }
                )
        # Ordered: MySQL evaluates SET left to right, so columns read before attempt changes.
        conn.execute(sa.update(j).where(j.c.id == job.id).ordered_values(*values.items()))

    def join_lines(self, conn: Connection, ids: Sequence[int]) -> None:
        """Jobs put back to wait (requeued from the dead) join the back of their key's line."""
        j = self.jobs
        rows = conn.execute(
            sa.select(j.c.id, j.c.queue, j.c["key"])
            .where(j.c.id.in_(list(ids)), j.c["key"].isnot(None))
            .order_by(j.c.id)
        ).all()
        if not rows:
            return
        places = self.places_of(conn, [(queue, key) for _, queue, key in rows])
        for (job_id, _, _), place in zip(rows, places, strict=True):
            conn.execute(
                sa.update(j)
                .where(j.c.id == job_id)
                .values(key_seq=place, status=Status.AVAILABLE if place == 1 else Status.BLOCKED)
            )

    def lock_lines(self, conn: Connection, ids: Sequence[int]) -> dict[int, tuple[str, str, int]]:
        """Lock the key rows of those of ``ids`` that head their line (before cancelling them:
        no promotion can then change which job heads it); id → (queue, key, place)."""
        j, k = self.jobs, self.tables.keys
        rows = conn.execute(
            sa.select(j.c.id, j.c.queue, j.c["key"], j.c.key_seq).where(
                j.c.id.in_(list(ids)), j.c["key"].isnot(None), j.c.key_seq.isnot(None)
            )
        ).all()
        for queue, key in sorted({(row[1], row[2]) for row in rows}):
            conn.execute(
                sa.select(k.c.last_seq)
                .where(k.c.queue == queue, k.c["key"] == key)
                .with_for_update()
            ).first()
        if not rows:
            return {}
        heads = conn.execute(
            sa.select(j.c.id).where(
                j.c.id.in_([row[0] for row in rows]), j.c.status == Status.AVAILABLE
            )
        ).scalars()
        found = {row[0]: (row[1], row[2], row[3]) for row in rows}
        return {int(i): found[i] for i in heads}

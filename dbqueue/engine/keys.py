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

from sqlalchemy.engine import Connection

from dbqueue.engine import catalog
from dbqueue.engine.statements import Statements
from dbqueue.job import Job, Status

#: Keys per multi-row upsert (4 parameters each, far below every driver's limit).
_UPSERT_ROWS = 2_000


class KeyLines:
    """The lines of keyed jobs: places taken at enqueue, the head's end, rows placed late."""

    def __init__(self, sql: Statements) -> None:
        self.sql = sql
        self.dialect = sql.dialect

    def take_places(self, conn: Connection, queue: str, key: str, count: int) -> int:
        """Add ``count`` places to the key's line; the last one's number. The places are
        ``last - count + 1 … last``; the key was idle iff ``last == count``."""
        params = {"queue": queue, "key": key, "count": count}
        if self.dialect.counter_returned:
            stmt = self.sql(catalog.keys_add_places, "last")
            return int(self.sql.compiled(stmt).raw_rows(conn, params)[0][0])
        self.sql.compiled(self.sql(catalog.keys_add_places, "")).rowcount(conn, params)
        read = self.sql(catalog.keys_last_place)
        return int(self.sql.compiled(read).raw_rows(conn, params)[0][0])

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
        found: dict[tuple[str, str], int] = {}
        lines = sorted(counts)
        returning = "line" if self.dialect.counter_returned else ""
        # executemany of the one-row statement (compiled once): SQLAlchemy sends it as
        # multi-row VALUES, in this order, with RETURNING where the database has it.
        for first in range(0, len(lines), _UPSERT_ROWS):
            chunk = lines[first : first + _UPSERT_ROWS]
            rows = [{"queue": q, "key": key, "count": counts[(q, key)]} for q, key in chunk]
            result = conn.execute(self.sql(catalog.keys_add_places, returning), rows)
            if not returning:
                result = conn.execute(self.sql.new(catalog.keys_last_places, chunk))
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
        if self.sql.compiled(self.sql(catalog.keys_drop_if_last)).rowcount(conn, params):
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
        new = self.sql.new
        # Someone joined the line: lock the key's row (enqueues of the key now wait), then look.
        if conn.execute(new(catalog.keys_lock, queue, key)).first() is None:
            return None
        if conn.execute(new(catalog.jobs_head_of_line, queue, key, job_id)).first() is not None:
            return None  # another job heads the line: never promote a second one
        while True:
            found = conn.execute(new(catalog.jobs_next_in_line, queue, key)).first()
            if found is None:
                conn.execute(new(catalog.keys_delete, queue, key))
                return None
            if conn.execute(new(catalog.jobs_unblock, found[0])).rowcount:
                return int(found[0])

    def back_of_line(self, conn: Connection, job: Job) -> None:
        """``exclusive`` mode: a failed attempt gives up the key and joins the back of its
        line (it heads it again at once if nobody waits)."""
        assert job.key is not None and job.key_seq is not None
        with self.dialect.statements_together(conn):  # as admit: place and row together
            self.release_key(conn, job.queue, job.key, job.key_seq, job.id)
            place = self.take_places(conn, job.queue, job.key, 1)
            conn.execute(self.sql.new(catalog.jobs_take_place, job.id, place))

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
        """Write a claimed row's place; behind the head, a committed claim is undone."""
        undo = job.status == Status.RUNNING
        conn.execute(self.sql.new(catalog.jobs_admit_to_line, job.id, job.key_seq, undo))

    def join_lines(self, conn: Connection, ids: Sequence[int]) -> None:
        """Jobs put back to wait (requeued from the dead) join the back of their key's line."""
        rows = conn.execute(self.sql.new(catalog.jobs_keyed_among, ids)).all()
        if not rows:
            return
        places = self.places_of(conn, [(queue, key) for _, queue, key in rows])
        for (job_id, _, _), place in zip(rows, places, strict=True):
            conn.execute(self.sql.new(catalog.jobs_take_place, job_id, place))

    def lock_lines(self, conn: Connection, ids: Sequence[int]) -> dict[int, tuple[str, str, int]]:
        """Lock the key rows of those of ``ids`` that head their line (before cancelling them:
        no promotion can then change which job heads it); id → (queue, key, place)."""
        rows = conn.execute(self.sql.new(catalog.jobs_placed_among, ids)).all()
        for queue, key in sorted({(row[1], row[2]) for row in rows}):
            conn.execute(self.sql.new(catalog.keys_lock, queue, key)).first()
        if not rows:
            return {}
        heads = conn.execute(self.sql.new(catalog.jobs_available_among, [row[0] for row in rows]))
        found = {row[0]: (row[1], row[2], row[3]) for row in rows}
        return {int(i): found[i] for i in heads.scalars()}

"""Enqueue: one job (precompiled, the transactional-enqueue hot path), many jobs in few
statements, and the finished record of a publication."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..instruments import observed_insert
from ..job import Status
from .base import EngineBase
from .records import NewJob, truncate

#: Rows per columnar INSERT (PostgreSQL): large enough that statement overhead vanishes.
_COLUMNAR_ROWS = 10_000
# SQLite's default limit (32766) is the lowest of the supported databases'.
_MAX_BIND_PARAMETERS = 32_000
#: What an optional column holds when a job leaves it unset (its server default).
_UNSET: dict[str, Any] = {"dead": False}


def _same_columns(rows: list[dict[str, Any]]) -> None:
    """A multi-row INSERT needs one column list: give every row the columns any row sets."""
    columns = set().union(*rows)
    for row in rows:
        if len(row) != len(columns):
            for name in columns.difference(row):
                row[name] = _UNSET.get(name)


class Inserts(EngineBase):
    def _insert_statement(self, timing: str) -> sa.Insert:
        """INSERT whose columns come from the parameters; with a delay, run_at is computed from
        the database clock and the ``delay_seconds`` parameter."""

        def build() -> sa.Insert:
            stmt = self._with_times(sa.insert(self.jobs), timing)
            if timing == "delay":
                delay = sa.bindparam("delay_seconds", type_=sa.Float())
                stmt = stmt.values(run_at=self.dialect.now_plus(delay))
            return stmt

        return self.statement(f"insert:{timing}", build)

    def insert(self, conn: Connection, job: NewJob) -> int:
        if self.instruments.enqueue:  # metrics or tracing: count it, give it a producer span
            return observed_insert(
                self.instruments.enqueue, [job], lambda: [self._insert(conn, job)]
            )[0]
        return self._insert(conn, job)

    def _insert(self, conn: Connection, job: NewJob) -> int:
        row = job.values()
        timing = job.timing
        if timing == "delay":
            row["delay_seconds"] = float(job.delay or 0)
        # Precompiled per set of columns: most of an enqueue's own CPU was SQLAlchemy's
        # execution and result layers around one INSERT. The id comes the way SQLAlchemy would
        # take it: the driver's lastrowid (MySQL, SQLite: no result set to parse), else
        # RETURNING.
        columns = tuple(row)
        if conn.dialect.postfetch_lastrowid:
            stmt = self.statement(
                f"insert:{timing}:{','.join(columns)}",
                lambda: self._build_insert(columns, timing),
            )
            with self.translate_errors():
                return int(self.compiled(stmt).lastrowid(conn, row))
        if self.dialect.returns_inserted_ids and conn.dialect.insert_returning:
            stmt = self.statement(
                f"insert:{timing}:returning:{','.join(columns)}",
                lambda: self._build_insert(columns, timing).returning(self.jobs.c.id),
            )
            with self.translate_errors():
                return int(self.compiled(stmt).raw_rows(conn, row)[0][0])
        with self.translate_errors():
            result = conn.execute(self._insert_statement(timing), row)
        return int(result.inserted_primary_key[0])

    def _build_insert(self, columns: tuple[str, ...], timing: str) -> sa.Insert:
        values = {
            name: sa.bindparam(name, type_=self.jobs.c[name].type)
            for name in columns
            if name != "delay_seconds"
        }
        return self._insert_statement(timing).values(values)

    def insert_finished(self, conn: Connection, job: NewJob, message: str) -> int:
        """Insert a row that is finished from the start (a publication's own record): no
        worker ever claims it, and purge removes it with the other finished jobs."""
        now = self.dialect.now()
        stmt = (
            self._with_times(sa.insert(self.jobs), job.timing)
            .values(job.values())
            .values(status=Status.SUCCEEDED, message=truncate(message), finished_at=now)
        )
        with self.translate_errors():
            result = conn.execute(stmt)
        return int(result.inserted_primary_key[0])

    def insert_many(
        self, conn: Connection, jobs: Sequence[NewJob], need_ids: bool = False
    ) -> list[int]:
        """Insert with one multi-row statement per timing kind (usually just one); ids come back
        in the order of ``jobs``. On databases whose INSERT cannot return ids (MySQL 8,
        SingleStore) the list is empty, unless ``need_ids`` (eager mode runs the jobs by id):
        then each job gets an INSERT of its own there.

        Ids are matched to rows by sorting: within one multi-row INSERT every supported database
        assigns ascending ids in VALUES order (a sequence/auto-increment is drawn row by row).
        SQLAlchemy's own ``sort_by_parameter_order`` would fall back to one INSERT per row on
        SQLite, which is what this method exists to avoid.
        """
        if self.instruments.enqueue:
            return observed_insert(
                self.instruments.enqueue, jobs, lambda: self._insert_many(conn, jobs, need_ids)
            )
        return self._insert_many(conn, jobs, need_ids)

    def _insert_many(self, conn: Connection, jobs: Sequence[NewJob], need_ids: bool) -> list[int]:
        groups: dict[str, list[int]] = {}
        for index, job in enumerate(jobs):
            groups.setdefault(job.timing, []).append(index)
        ids: list[int | None] = [None] * len(jobs)
        returning = (
            self.dialect.returns_inserted_ids
            and conn.dialect.insert_returning
            and conn.dialect.insert_executemany_returning
        )
        if need_ids and not returning:
            return [self._insert(conn, job) for job in jobs]
        for timing, indexes in groups.items():
            rows = [jobs[i].values() for i in indexes]
            if timing != "delay" and returning and len(rows) > 1:
                columnar = self._insert_columnar(conn, rows, timing)
                if columnar is not None:
                    for i, new_id in zip(indexes, columnar, strict=True):
                        ids[i] = new_id
                    continue
            if timing == "delay":
                for i, row in zip(indexes, rows, strict=True):
                    row["delay_seconds"] = float(jobs[i].delay or 0)
            _same_columns(rows)
            stmt = self._insert_statement(timing)
            # As many rows per statement as the drivers' bind-parameter limits allow.
            page = max(1, _MAX_BIND_PARAMETERS // (len(rows[0]) + 1))
            with self.translate_errors():
                if returning:
                    stmt = self.statement(
                        f"insert:{timing}:returning", lambda s=stmt: s.returning(self.jobs.c.id)
                    )
                    result = conn.execution_options(insertmanyvalues_page_size=page).execute(
                        stmt, rows
                    )
                    for i, new_id in zip(indexes, sorted(result.scalars()), strict=True):
                        ids[i] = int(new_id)
                else:
                    conn.execute(stmt, rows)
        return [i for i in ids if i is not None]

    def _insert_columnar(
        self, conn: Connection, rows: list[dict[str, Any]], timing: str
    ) -> list[int] | None:
        """Insert rows as one list per column where the dialect can (PostgreSQL's unnest);
        returns their ids in order, or None to use the multi-row VALUES insert."""
        _same_columns(rows)
        columns = tuple(sorted(rows[0]))
        stmt = self.statement(
            f"insert:columnar:{timing}:{','.join(columns)}",
            lambda: self._build_columnar(columns, timing),
        )
        if stmt is False:
            return None
        found: list[int] = []
        for first in range(0, len(rows), _COLUMNAR_ROWS):
            chunk = rows[first : first + _COLUMNAR_ROWS]
            params = {name: [row[name] for row in chunk] for name in columns}
            with self.translate_errors():
                found += sorted(int(i) for i in conn.execute(stmt, params).scalars())
        return found

    def _build_columnar(self, columns: tuple[str, ...], timing: str) -> Any:
        stmt = self.dialect.columnar_insert(self.jobs, columns)
        if stmt is None:
            return False  # remembered: this dialect has none
        return self._with_times(stmt, timing).returning(self.jobs.c.id)

    def _with_times(self, stmt: sa.Insert, timing: str) -> sa.Insert:
        """Where the DDL defaults cannot be the UTC clock, write it explicitly."""
        if not self.dialect.insert_sets_times:
            return stmt
        now = self.dialect.now()
        stmt = stmt.values(created_at=now, updated_at=now)
        return stmt.values(run_at=now) if timing == "now" else stmt

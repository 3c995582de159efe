"""Enqueue: one job (precompiled, the transactional-enqueue hot path), many jobs in few
statements, and the finished record of a publication."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue.engine import catalog
from dbqueue.engine.compiled import CompiledStatement
from dbqueue.engine.instruments import Instruments, observed_insert
from dbqueue.engine.keys import KeyLines
from dbqueue.engine.records import ALWAYS, NewJob, flat_values, new_jobs, truncate
from dbqueue.engine.statements import Statements
from dbqueue.job import Status

#: Rows per columnar INSERT (PostgreSQL): large enough that statement overhead vanishes.
_COLUMNAR_ROWS = 10_000
#: Rows per multi-row INSERT at most: compiling one costs about 0.3 ms a row (once per size),
#: and past a few hundred rows a statement more costs less than a row in Python. Bound
#: parameters at most: SQLite's default limit (32766) is the lowest of the supported databases'.
_MAX_PAGE = 250
_MAX_BIND_PARAMETERS = 32_000
#: Multi-row INSERTs kept compiled per QueueEngine (one per number of rows and column set).
_KEPT_SIZES = 8
_ROWS_LOCK = threading.Lock()
#: What an optional column holds when a job leaves it unset (its server default).
_UNSET: dict[str, Any] = {"dead": False, "status": Status.AVAILABLE}


def _same_columns(rows: list[dict[str, Any]]) -> None:
    """A multi-row INSERT needs one column list: give every row the columns any row sets."""
    columns = set().union(*rows)
    for row in rows:
        if len(row) != len(columns):
            for name in columns.difference(row):
                row[name] = _UNSET.get(name)


def _in_line(row: dict[str, Any], place: int) -> dict[str, Any]:
    """A keyed job's row: its place in its key's line, blocked unless it heads it."""
    row["key_seq"] = place
    if place != 1:
        row["status"] = Status.BLOCKED
    return row


class Inserts:
    def __init__(self, sql: Statements, keys: KeyLines, instruments: Instruments) -> None:
        self.sql = sql
        self.keys = keys
        self.dialect = sql.dialect
        #: Metrics and tracing observers (dbqueue.engine.instruments); empty unless turned on.
        self.instruments = instruments
        #: (timing, columns) → the one-row INSERT compiled, and whether lastrowid gives its id.
        self._one_row_inserts: dict[tuple[str, tuple[str, ...]], Any] = {}
        #: Multi-row INSERTs compiled by number of rows (a few kept), and the sizes seen once.
        self._rows_statements: OrderedDict[tuple[Any, ...], CompiledStatement] = OrderedDict()
        self._rows_sizes_seen: set[tuple[Any, ...]] = set()

    def insert(self, conn: Connection, job: NewJob) -> int:
        if self.instruments.enqueue:  # metrics or tracing: count it, give it a producer span
            return observed_insert(
                self.instruments.enqueue, [job], lambda: [self._insert(conn, job)]
            )[0]
        return self._insert(conn, job)

    def _insert(self, conn: Connection, job: NewJob) -> int:
        row = job.values()
        if job.key is not None:
            _in_line(row, self.keys.take_places(conn, job.queue, job.key, 1))
        timing = job.timing
        if timing == "delay":
            row["delay_seconds"] = float(job.delay or 0)
        # Precompiled per set of columns: most of an enqueue's own CPU was SQLAlchemy's
        # execution and result layers around one INSERT. The id comes the way SQLAlchemy would
        # take it: the driver's lastrowid (MySQL, SQLite: no result set to parse), else
        # RETURNING. Looked up by (timing, columns) directly: a one-job enqueue is this.
        key = (timing, tuple(row))
        found = self._one_row_inserts.get(key)
        if found is None:
            found = self._one_row_insert(conn, key)
        compiled, lastrowid = found
        if compiled is None:
            with self.sql.translate_errors():
                result = conn.execute(self.sql(catalog.jobs_insert, timing), row)
            return int(result.inserted_primary_key[0])
        try:
            if lastrowid:
                return int(compiled.lastrowid(conn, row))
            return int(compiled.raw_rows(conn, row)[0][0])
        except sa.exc.DBAPIError as exc:  # what translate_errors does, without its cost
            self.sql.translate_errors().__exit__(type(exc), exc, None)
            raise

    def _one_row_insert(
        self, conn: Connection, key: tuple[str, tuple[str, ...]]
    ) -> tuple[CompiledStatement | None, bool]:
        """(the compiled one-row INSERT of these columns, whether its id is the cursor's
        lastrowid); (None, False) where neither way gives the id (then SQLAlchemy's own)."""
        timing, columns = key
        if conn.dialect.postfetch_lastrowid:
            stmt = self.sql(catalog.jobs_insert_one, columns, timing, False)
            found: tuple[CompiledStatement | None, bool] = (self.sql.compiled(stmt), True)
        elif self.dialect.returns_inserted_ids and conn.dialect.insert_returning:
            stmt = self.sql(catalog.jobs_insert_one, columns, timing, True)
            found = (self.sql.compiled(stmt), False)
        else:
            found = (None, False)
        with _ROWS_LOCK:
            kept = self._one_row_inserts
            if len(kept) > 1000:  # column sets are few; a bound all the same
                kept.clear()
            kept[key] = found
        return found

    def insert_finished(self, conn: Connection, job: NewJob, message: str) -> int:
        """Insert a row that is finished from the start (a publication's own record): no
        worker ever claims it, and purge removes it with the other finished jobs."""
        stmt = self.sql.new(
            catalog.jobs_insert_finished, job.values(), job.timing, truncate(message)
        )
        with self.sql.translate_errors():
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

    def insert_plain(self, conn: Connection, flat: list[Any], need_ids: bool = False) -> list[int]:
        """``insert_many`` for jobs that set only the ALWAYS columns, given as one flat list
        (``client.plain_rows``): the common bulk enqueue, without a NewJob per row. Observers
        and per-row inserts (ids needed where INSERT cannot return them) get NewJobs."""
        count = len(flat) // len(ALWAYS)
        returning = self._returns_many(conn)
        if self.instruments.enqueue or (need_ids and not returning):
            return self.insert_many(conn, new_jobs(flat), need_ids)
        with self.sql.translate_errors():
            return self._insert_flat(conn, flat, count, "now", returning)

    def _returns_many(self, conn: Connection) -> bool:
        return bool(
            self.dialect.returns_inserted_ids
            and conn.dialect.insert_returning
            and conn.dialect.insert_executemany_returning
        )

    def _insert_many(self, conn: Connection, jobs: Sequence[NewJob], need_ids: bool) -> list[int]:
        groups: dict[str, list[int]] = {}
        for index, job in enumerate(jobs):
            groups.setdefault(job.timing, []).append(index)
        ids: list[int | None] = [None] * len(jobs)
        returning = self._returns_many(conn)
        if need_ids and not returning:
            return [self._insert(conn, job) for job in jobs]
        if len(groups) == 1 and "delay" not in groups:
            flat = flat_values(jobs)  # None if a job sets an optional column (a key among them)
            if flat is not None:
                with self.sql.translate_errors():
                    return self._insert_flat(conn, flat, len(jobs), jobs[0].timing, returning)
        all_rows = [job.values() for job in jobs]
        keyed = [i for i, job in enumerate(jobs) if job.key is not None]
        if keyed:
            lines = [(jobs[i].queue, jobs[i].key) for i in keyed]
            for i, place in zip(keyed, self.keys.places_of(conn, lines), strict=True):  # type: ignore[arg-type]
                _in_line(all_rows[i], place)
        for timing, indexes in groups.items():
            rows = [all_rows[i] for i in indexes]
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
            with self.sql.translate_errors():
                found = self._insert_rows(conn, rows, timing, returning)
            for i, new_id in zip(indexes, found, strict=returning):
                ids[i] = new_id
        return [i for i in ids if i is not None]

    def _insert_rows(
        self, conn: Connection, rows: list[dict[str, Any]], timing: str, returning: bool
    ) -> list[int]:
        """Insert rows (all with the same columns) in one multi-row INSERT (a page of at most
        _MAX_PAGE rows); their ids, in order, when ``returning``.

        A number of rows seen before runs a statement compiled for exactly that many rows, its
        values handed to the driver as they are (through the columns' bind processors):
        SQLAlchemy's "insertmanyvalues" (``Connection.execute(stmt, rows)``) renders and
        processes every row's parameters in Python on each call, half of MariaDB's and SQLite's
        bulk-enqueue CPU. Compiling costs about 0.3 ms a row, once: a count seen once goes
        through SQLAlchemy, and a few counts are kept (_KEPT_SIZES), so that callers whose
        batch sizes vary keep neither paying it nor growing the cache.
        """
        columns = tuple(rows[0])
        flat = [row[column] for row in rows for column in columns]
        return self._insert_paged(conn, columns, flat, len(rows), timing, returning)

    def _insert_page(
        self, conn: Connection, page: list[dict[str, Any]], timing: str, returning: bool
    ) -> list[int]:
        """A page of rows through SQLAlchemy's own multi-row INSERT (a count not compiled)."""
        build = catalog.jobs_insert_returning if returning else catalog.jobs_insert
        stmt = self.sql(build, timing)
        sized = conn.execution_options(insertmanyvalues_page_size=len(page))
        result = sized.execute(stmt, page)
        return sorted(int(i) for i in result.scalars()) if returning else []

    def _insert_flat(
        self, conn: Connection, flat: list[Any], count: int, timing: str, returning: bool
    ) -> list[int]:
        """``_insert_many`` for jobs that set only the ALWAYS columns, given as one flat list
        (``flat_values``): the common bulk enqueue, without a dict per row."""
        if returning and count > 1:
            found = self._columnar_flat(conn, flat, count, timing)
            if found is not None:
                return found
        return self._insert_paged(conn, ALWAYS, flat, count, timing, returning)

    def _insert_paged(
        self,
        conn: Connection,
        columns: tuple[str, ...],
        flat: list[Any],
        count: int,
        timing: str,
        returning: bool,
    ) -> list[int]:
        """``_insert_rows`` for rows given as one flat list, each row's values in the order of
        ``columns``. Where the dialect knows a multi-row INSERT's ids to be consecutive, they
        come from ``lastrowid`` instead of RETURNING (``Dialect.consecutive_ids``)."""
        width = len(columns)
        page_size = min(_MAX_PAGE, _MAX_BIND_PARAMETERS // (width + 1))
        consecutive = self.dialect.consecutive_ids(conn, count) if returning else None
        found: list[int] = []
        for first in range(0, count, page_size):
            size = min(page_size, count - first)
            page = flat[first * width : (first + size) * width]
            compiled = self._rows_statement(
                columns, timing, returning and consecutive is None, size
            )
            if compiled is None:
                rows = [
                    dict(zip(columns, page[i : i + width], strict=True))
                    for i in range(0, len(page), width)
                ]
                found += self._insert_page(conn, rows, timing, returning)
            elif consecutive is not None:
                found += consecutive(compiled.lastrowid_flat(conn, columns, size, page), size)
            elif returning:
                rows_back = compiled.raw_rows_flat(conn, columns, size, page)
                found += sorted(int(row[0]) for row in rows_back)
            else:
                compiled.rowcount_flat(conn, columns, size, page)
        return found

    def _columnar_flat(
        self, conn: Connection, flat: list[Any], count: int, timing: str
    ) -> list[int] | None:
        """``_insert_columnar`` for a flat list: each column is a slice of it."""
        stmt = self._columnar_statement(tuple(sorted(ALWAYS)), timing)
        if stmt is False:
            return None
        width = len(ALWAYS)
        found: list[int] = []
        for first in range(0, count, _COLUMNAR_ROWS):
            chunk = flat[first * width : (first + _COLUMNAR_ROWS) * width]
            params = {name: chunk[index::width] for index, name in enumerate(ALWAYS)}
            found += sorted(int(i) for i in conn.execute(stmt, params).scalars())
        return found

    def _rows_statement(
        self, columns: tuple[str, ...], timing: str, returning: bool, size: int
    ) -> CompiledStatement | None:
        """The statement for ``size`` rows, compiled the second time that size is asked for
        (None before)."""
        key = (columns, timing, returning, size)
        with _ROWS_LOCK:
            kept = self._rows_statements
            found = kept.get(key)
            if found is not None:
                kept.move_to_end(key)
                return found
            seen = self._rows_sizes_seen
            if key not in seen:
                if len(seen) > 1000:
                    seen.clear()
                seen.add(key)
                return None
        stmt = self.sql.new(catalog.jobs_insert_rows, columns, timing, returning, size)
        found = CompiledStatement(stmt, self.dialect.sa_dialect)
        with _ROWS_LOCK:
            kept[key] = found
            while len(kept) > _KEPT_SIZES:
                kept.popitem(last=False)
        return found

    def _insert_columnar(
        self, conn: Connection, rows: list[dict[str, Any]], timing: str
    ) -> list[int] | None:
        """Insert rows as one list per column where the dialect can (PostgreSQL's unnest);
        returns their ids in order, or None to use the multi-row VALUES insert."""
        _same_columns(rows)
        columns = tuple(sorted(rows[0]))
        stmt = self._columnar_statement(columns, timing)
        if stmt is False:
            return None
        found: list[int] = []
        for first in range(0, len(rows), _COLUMNAR_ROWS):
            chunk = rows[first : first + _COLUMNAR_ROWS]
            params = {name: [row[name] for row in chunk] for name in columns}
            with self.sql.translate_errors():
                found += sorted(int(i) for i in conn.execute(stmt, params).scalars())
        return found

    def _columnar_statement(self, columns: tuple[str, ...], timing: str) -> Any:
        """The columnar INSERT of these columns (False: the dialect has none)."""
        return self.sql(catalog.jobs_insert_columnar, columns, timing)

"""What every part of the engine shares: the tables and dialect, the statement cache that keeps
the hot path off SQLAlchemy's construction and compilation work, and error translation."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue.base.results import finished_notice
from dbqueue.dialects import Dialect
from dbqueue.engine.compiled import CompiledStatement
from dbqueue.engine.instruments import Instruments
from dbqueue.errors import SchemaMissingError
from dbqueue.job import ROW_FIELDS
from dbqueue.schema.tables import QueueTables
from dbqueue.schema.types import UtcDateTime

# Columns a claim returns before the claim time; Job has one attribute for each.
_JOB_COLUMNS = ROW_FIELDS[:-1]


@functools.cache
def id_names(size: int) -> tuple[str, ...]:
    """Bind names of a list of ``size`` job ids: ``id_0`` … ``id_<size-1>``."""
    return tuple(f"id_{i}" for i in range(size))


class EngineBase:
    """State and helpers of one QueueEngine; each part of the engine extends it."""

    def __init__(
        self, tables: QueueTables, dialect: Dialect, instruments: Instruments | None = None
    ) -> None:
        self.tables = tables
        self.dialect = dialect
        #: Metrics and tracing observers (dbqueue.instruments); empty unless turned on.
        self.instruments = instruments if instruments is not None else Instruments()
        self.jobs = tables.jobs
        self._job_columns = [self.jobs.c[name] for name in _JOB_COLUMNS]
        self._claim_order = dialect.claim_order(self.jobs)
        self._claim_key = [column.name for column in self._claim_order]
        self._statements: dict[str, Any] = {}
        #: id(statement) -> (statement, its CompiledStatement); the statement is kept alive.
        self._compiled: dict[int, tuple[Any, CompiledStatement]] = {}

    def db_now(self) -> sa.ColumnElement:
        """The database clock, typed so that Python receives an aware UTC datetime."""
        return sa.type_coerce(self.dialect.now(), UtcDateTime())

    def statement(self, key: str, build: Callable[[], Any]) -> Any:
        """A statement built once per QueueEngine and reused: executing the same object skips
        SQLAlchemy's construction and cache-key work, which dominates a no-op job's cost."""
        found = self._statements.get(key)
        if found is None:
            found = self._statements[key] = build()
        return found

    def _id_list(self, size: int) -> sa.ColumnElement:
        """``id IN (:id_0, …)``: a statement over ``size`` ids, compiled once per size (an
        expanding IN would be rendered again on every execution, and cannot be compiled in
        advance)."""
        id_type = self.jobs.c.id.type
        binds = [sa.bindparam(name, type_=id_type) for name in id_names(size)]
        return self.jobs.c.id.in_(binds)

    def compiled(self, stmt: Any) -> CompiledStatement:
        """``stmt`` (a statement from ``statement()``, built once) compiled for the hot path."""
        found = self._compiled.get(id(stmt))
        if found is None:
            found = self._compiled[id(stmt)] = (
                stmt,
                CompiledStatement(stmt, self.dialect.sa_dialect),
            )
        return found[1]

    def announce_finished(self, conn: Connection, job_ids: Sequence[int]) -> None:
        """Tell the callers waiting for these jobs (``app.call``) that they finished, where the
        database can push (PostgreSQL: a NOTIFY, delivered when the transaction commits)."""
        stmt = self.statement("announce", self._announcement)
        if stmt is not False:  # precompiled: a call's round trip waits for it
            channel = self.tables.names.qualified_jobs
            self.compiled(stmt).rowcount(
                conn, {"channel": channel, "message": finished_notice(job_ids)}
            )

    def _announcement(self) -> Any:
        found = self.dialect.announcement()
        return False if found is None else found  # False: remembered, the database has none

    def _claimed_by(self, worker_id: str | None) -> list[sa.ColumnElement]:
        """The fence of an outcome or a release: only rows this worker claimed, if given."""
        return [] if worker_id is None else [self.jobs.c.worker_id == worker_id]

    def translate_errors(self) -> _TranslateErrors:
        return _TranslateErrors(self)


class _TranslateErrors:
    """Turn "no such table" from any driver into SchemaMissingError naming the fix."""

    def __init__(self, engine: EngineBase) -> None:
        self.engine = engine

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, sa.exc.DBAPIError) and self.engine.dialect.is_missing_table(exc):
            names = self.engine.tables.names
            where = f" in schema {names.schema!r}" if names.schema else ""
            raise SchemaMissingError(
                f"the queue table {names.jobs!r}{where} does not exist: run `dbqueue migrate` "
                "(with the same URL and table prefix) to create it"
            ) from exc
        return False

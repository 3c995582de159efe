"""What every part of the engine shares: the tables and the dialect, the catalog's statements
built once and compiled once (the hot path stays off SQLAlchemy's construction and compilation
work), the database clock, and the translation of "no such table" into the fix."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue.base.results import finished_notice
from dbqueue.dialects import Dialect
from dbqueue.engine import catalog
from dbqueue.engine.compiled import CompiledStatement
from dbqueue.errors import SchemaMissingError
from dbqueue.schema.tables import QueueTables
from dbqueue.schema.types import UtcDateTime


class Statements:
    """The catalog (``catalog.py``) bound to one set of queue tables on one database."""

    def __init__(self, tables: QueueTables, dialect: Dialect) -> None:
        self.tables = tables
        self.dialect = dialect
        self.jobs = tables.jobs
        #: The columns of the claim order, by name (a claim's rows are sorted by them).
        self.claim_key = [column.name for column in dialect.claim_order(tables.jobs)]
        self._built: dict[tuple[Any, ...], Any] = {}
        #: id(statement) -> (statement, its CompiledStatement); the statement is kept alive.
        self._compiled: dict[int, tuple[Any, CompiledStatement]] = {}

    def __call__(self, build: Callable[..., Any], *args: Any) -> Any:
        """``build(tables, dialect, *args)``, built once per distinct ``args`` and reused:
        executing the same object skips SQLAlchemy's construction and cache-key work, which
        dominates a no-op job's cost. ``args`` must be few and hashable (flags, sizes)."""
        key = (build, *args)
        found = self._built.get(key)
        if found is None:
            found = self._built[key] = build(self.tables, self.dialect, *args)
        return found

    def cached(self, key: Any, build: Callable[[], Any]) -> Any:
        """A statement from elsewhere (a strategy's lock release), built once per ``key``."""
        found = self._built.get(key)
        if found is None:
            found = self._built[key] = build()
        return found

    def new(self, build: Callable[..., Any], *args: Any) -> Any:
        """``build(tables, dialect, *args)`` built afresh (its arguments are values: ids, names)."""
        return build(self.tables, self.dialect, *args)

    def compiled(self, stmt: Any) -> CompiledStatement:
        """``stmt`` (built once, by ``__call__``) compiled for the hot path."""
        found = self._compiled.get(id(stmt))
        if found is None:
            found = self._compiled[id(stmt)] = (
                stmt,
                CompiledStatement(stmt, self.dialect.sa_dialect),
            )
        return found[1]

    def db_now(self) -> sa.ColumnElement:
        """The database clock, typed so that Python receives an aware UTC datetime."""
        return sa.type_coerce(self.dialect.now(), UtcDateTime())

    def announce_finished(self, conn: Connection, job_ids: Sequence[int]) -> None:
        """Tell the callers waiting for these jobs (``app.call``) that they finished, where the
        database can push (PostgreSQL: a NOTIFY, delivered when the transaction commits)."""
        stmt = self(catalog.jobs_announce_finished)
        if stmt is not False:  # precompiled: a call's round trip waits for it
            channel = self.tables.names.qualified_jobs
            self.compiled(stmt).rowcount(
                conn, {"channel": channel, "message": finished_notice(job_ids)}
            )

    def announce_runnable(self, conn: Connection, queues: Sequence[str]) -> None:
        """Wake the workers of these queues once the transaction commits, as an insert does,
        where the database can push (PostgreSQL: a NOTIFY); elsewhere they poll."""
        stmt = self(catalog.jobs_announce_runnable)
        if stmt is not False:
            channel = self.tables.names.qualified_jobs
            for queue in queues:
                conn.execute(stmt, {"channel": channel, "message": queue})

    def translate_errors(self) -> TranslateErrors:
        return TranslateErrors(self.tables, self.dialect)


class TranslateErrors:
    """Turn "no such table" from any driver into SchemaMissingError naming the fix."""

    def __init__(self, tables: QueueTables, dialect: Dialect) -> None:
        self.tables = tables
        self.dialect = dialect

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, sa.exc.DBAPIError) and self.dialect.is_missing_table(exc):
            names = self.tables.names
            where = f" in schema {names.schema!r}" if names.schema else ""
            raise SchemaMissingError(
                f"the queue table {names.jobs!r}{where} does not exist: run `dbqueue migrate` "
                "(with the same URL and table prefix) to create it"
            ) from exc
        return False

"""SQLite, the embedded default: one writer at a time, so the database itself serialises claims.

SQLite has no row locks and SQLAlchemy's SQLite compiler silently drops ``with_for_update()``, so
exclusivity comes from ``BEGIN IMMEDIATE``: a transaction that reads and then writes (a claim, a
requeue) takes the write lock when it begins (a deferred one that later writes fails with
SQLITE_BUSY instead of waiting), WAL lets readers run beside the writer, and ``busy_timeout``
makes a second writer wait its turn. Other transactions stay deferred, so reads never wait.
All processes must share one host (WAL needs shared memory).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.elements import ColumnElement

from dbqueue.base.wakeup import Notifier
from dbqueue.dialects.base import WRITE_INTENT, Dialect, seconds_expression
from dbqueue.dialects.sqlite_watch import CommitWatcher, FinishWatcher
from dbqueue.errors import ConfigurationError

_CLOCK_FORMAT = "%Y-%m-%d %H:%M:%f"  # UTC, the layout SQLAlchemy stores datetimes in
BUSY_TIMEOUT_MS = 30_000
#: The file beside the database that holds cancel requests (``side_database_url``).
SIDE_FILE_SUFFIX = "-dbqueue-cancels"


class LenientDateTime(sqlite.DATETIME):
    """SQLite stores whatever text a hand-written INSERT gives a timestamp column. A value that
    is no timestamp reads as None instead of raising: an exception while reading claimed rows
    would stop every claim of the queue, not just the bad job."""

    def result_processor(self, dialect: Any, coltype: Any) -> Any:
        parse = super().result_processor(dialect, coltype)
        if parse is None:
            return None

        def process(value: Any) -> Any:
            try:
                return parse(value)
            except (ValueError, TypeError):
                return None

        return process


class SQLiteDialect(Dialect):
    name = "sqlite"
    sqlalchemy_names = ("sqlite",)
    url_driver = "sqlite"
    async_driver = "aiosqlite"
    sync_drivers = {"aiosqlite": "pysqlite"}
    default_strategy = "sqlite"
    single_writer = True
    needs_batch_alter = True

    def consecutive_ids(self, conn: Connection, count: int) -> Callable[[Any, int], range] | None:
        # One writer at a time, and a new rowid is the largest one + 1 (dbqueue's ids are never
        # near 2**63, where SQLite would pick at random); lastrowid is the last row's.
        return _ids_up_to

    def skip_locked_unsupported_reason(self) -> str:
        return "SQLite has no row locks (no SKIP LOCKED); use --strategy sqlite (the default)"

    def now(self) -> ColumnElement:
        return sa.func.strftime(_CLOCK_FORMAT, "now")

    def now_plus(self, seconds: float | ColumnElement) -> ColumnElement:
        modifier = sa.func.printf("%+.6f seconds", seconds_expression(seconds))
        return sa.func.strftime(_CLOCK_FORMAT, "now", modifier)

    def take_write_lock(self, conn: Any, table: sa.Table) -> None:
        # A write statement takes the lock when it starts, whether or not a row matches, and
        # waits for it (busy timeout); one that matches nothing changes nothing.
        conn.execute(sa.update(table).where(sa.false()).values({table.c.id: table.c.id}))

    def insert_unless_present(self, table: sa.Table) -> sa.Insert:
        return sqlite.insert(table).on_conflict_do_nothing()  # SQLite >= 3.24

    def insert_or_count(self, table: sa.Table, counter: str) -> sa.Insert:
        stmt = sqlite.insert(table)
        return stmt.on_conflict_do_update(
            index_elements=list(table.primary_key.columns),
            set_={counter: table.c[counter] + 1},
        )

    counter_returned = True

    def add_to_counter(self, table: sa.Table, counter: str) -> sa.Insert:
        stmt = sqlite.insert(table)  # ON CONFLICT DO UPDATE: SQLite >= 3.24, RETURNING >= 3.35
        keys = [column.name for column in table.primary_key]
        return stmt.on_conflict_do_update(
            index_elements=keys, set_={counter: table.c[counter] + stmt.excluded[counter]}
        )

    def json_list_append(
        self, column: ColumnElement, entry: ColumnElement, keep: int
    ) -> ColumnElement:
        # strftime's %f is seconds with milliseconds: SQLite's clock has no finer grain.
        item = sa.func.json_set(entry, "$.at", sa.func.strftime("%Y-%m-%dT%H:%M:%fZ", "now"))
        listed = sa.func.coalesce(column, sa.literal("[]", sa.Text()))
        kept = sa.case(
            (sa.func.json_array_length(listed) >= keep, sa.func.json_remove(listed, "$[0]")),
            else_=listed,
        )
        return sa.func.json_insert(kept, "$[#]", item)  # '$[#]': after the last (3.31+)

    def unindexed(self, column: sa.ColumnElement) -> ColumnElement:
        # Without statistics SQLite prefers an equality on an indexed column (status, in the
        # claim index) over a rowid IN list: the guarded UPDATE of a batch then walks the claim
        # index it is modifying, five times slower. '' || status cannot use an index.
        return sa.literal_column("''") + column

    @classmethod
    def timestamp_type(cls) -> sa.types.TypeEngine:
        return LenientDateTime()

    @classmethod
    def server_now_default(cls) -> Any:
        return sa.text(f"(strftime('{_CLOCK_FORMAT}', 'now'))")

    @classmethod
    def check_url(cls, url: sa.engine.URL) -> None:
        # An in-memory database lives and dies with one connection (SQLAlchemy keeps one per
        # thread for it): a worker's engine, and each of its threads, would get an empty one.
        if not url.database or url.database == ":memory:" or url.query.get("mode") == "memory":
            raise ConfigurationError(
                f"{url!r} is an in-memory SQLite database, which no other connection (and so no "
                "worker) can see: use a file, e.g. sqlite:///dbqueue.db"
            )

    @classmethod
    def configure_engine(cls, engine: Engine) -> None:
        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection: Any, record: Any) -> None:
            # Take transaction control away from pysqlite so that BEGIN IMMEDIATE and SAVEPOINT
            # mean what they say.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(connection: Any) -> None:
            write = connection.get_execution_options().get(WRITE_INTENT)
            # Straight to the driver: a full SQLAlchemy execution here would cost as much as
            # the enqueue's own INSERT.
            begin = "BEGIN IMMEDIATE" if write else "BEGIN"
            try:
                connection.connection.dbapi_connection.execute(begin)
            except sqlite3.Error as exc:
                # An event's error reaches the caller unwrapped: wrap it as any statement's
                # would be, so "database is locked" past the busy timeout is handled (retried,
                # a maintenance tick skipped) like the same error from a statement.
                raise sa.exc.DBAPIError.instance(begin, None, exc, sqlite3.Error) from exc

    def notifier(self, engine: Engine, channel: str) -> Notifier:
        return CommitWatcher(engine.url)

    finishes_pushed = True

    def finish_listener(
        self, engine: Engine, channel: str, on_finished: Callable[[list[int] | None], None]
    ) -> Notifier | None:
        return FinishWatcher(engine.url, on_finished)

    def end_connection(self, engine: Engine, dbapi_connection: Any) -> bool:
        # The stuck thread holds SQLite's write lock (BEGIN IMMEDIATE) until its connection
        # rolls back: interrupt whatever statement runs, then close the connection, which rolls
        # back and releases the lock. sqlite3 allows this from another thread (SQLAlchemy opens
        # file databases with check_same_thread=False), and a closed connection refuses any
        # later statement from the stuck thread.
        dbapi_connection.interrupt()
        dbapi_connection.close()
        return True

    @classmethod
    def side_database_url(cls, url: sa.engine.URL) -> sa.engine.URL:
        # The worker running a batch holds this file's only write lock until the batch ends:
        # cancel requests live in a file of their own beside it, whose lock is only ever held
        # for one short write. Absolute, so every process names the same file.
        path = os.path.abspath(url.database or "")
        return url.set(database=f"{path}{SIDE_FILE_SUFFIX}")

    def is_missing_table(self, exc: BaseException) -> bool:
        return "no such table" in str(getattr(exc, "orig", exc))

    def is_transient(self, exc: BaseException) -> bool:
        return "database is locked" in str(getattr(exc, "orig", exc))


def _ids_up_to(last: Any, count: int) -> range:
    return range(int(last) - count + 1, int(last) + 1)

"""SingleStore: the lock server makes claims exclusive; the table is a sharded rowstore.

What SingleStore lacks, per its documentation, and what dbqueue does instead:

- no ``SKIP LOCKED``/``NOWAIT`` and no named locks (GET_LOCK): the ``lock_server`` strategy, whose
  claim is a compare-and-set ``UPDATE … WHERE id IN (…) AND status = 'available'`` guarded by the
  lock server's per-job lock (a write that scans the primary key locks the row before evaluating
  the WHERE, so two claimers cannot both win);
- no savepoints: ``supports_savepoints`` is False, so a worker runs each job in a transaction of
  its own (batch size 1) and records a failure in a second one;
- ``AUTO_INCREMENT`` is unique but not monotonic across aggregators: jobs are claimed in
  (priority, run_at, created_at) order, never by id;
- no triggers, no foreign keys (dbqueue's tables have neither), no ``UPDATE … LIMIT``, no update
  of a shard key, every unique key must contain the shard key: the queue tables are sharded
  rowstore tables (``CREATE ROWSTORE TABLE``, ``SHARD KEY`` = the primary key); Alembic's
  version table gets no primary key, because a migration UPDATEs its only column;
- no ``INSERT … RETURNING``: ``enqueue_many`` returns no ids;
- ``time_zone`` cannot be set per session and a column DEFAULT must be a plain time function:
  timestamps default to ``CURRENT_TIMESTAMP(6)`` (the cluster's zone, UTC as SingleStore
  recommends) for plain SQL inserts, while dbqueue's own inserts write ``UTC_TIMESTAMP(6)``.

Driver facts (sqlalchemy-singlestoredb): the dialect is named ``singlestoredb``, subclasses
MySQL's, ignores ``mysql_*`` options, renders ``CAST(x AS FLOAT)`` as ``x :> FLOAT`` (which only
SingleStore parses) and would print SKIP LOCKED if asked; its connections autocommit unless told
otherwise, so dbqueue adds ``autocommit=false`` to every URL.

The same module serves a MySQL-compatible server reached through the singlestoredb driver — the
test suite runs "the SingleStore path" against MariaDB this way. A connection asks
``@@memsql_version`` once: only a real SingleStore gets the SingleStore-only DDL (ROWSTORE, SHARD
KEY); a stand-in gets READ COMMITTED, SingleStore's only isolation level. Everything else —
strategy, ordering, transactions per job, no RETURNING — is the same on both.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy_singlestoredb import RowStore, ShardKey

from dbqueue.dialects.base import Dialect, driver_code
from dbqueue.dialects.mysql import kill_connection
from dbqueue.errors import ConfigurationError
from dbqueue.schema.types import PayloadProcessing

_NO_SUCH_TABLE = 1146
_TRANSIENT = {1205, 1213}  # lock wait timeout (also how SingleStore reports a deadlock), deadlock
#: Attribute of the SQLAlchemy dialect: the SingleStore version, () for a MySQL-compatible
#: stand-in, absent while unknown.
_FLAVOUR = "_dbqueue_singlestore_version"
_TRUE = {"1", "true", "yes", "on"}


class _JsonLongText(PayloadProcessing, mysql.LONGTEXT):
    """Payloads as LONGTEXT: the singlestoredb driver decodes a JSON column itself on SingleStore
    and not on MySQL-compatible servers, which would make a JSON string payload ambiguous."""


class _date_add_microseconds(FunctionElement):
    """``DATE_ADD(when, INTERVAL n MICROSECOND)`` (what SingleStore's own dbt adapter emits)."""

    name = "date_add"
    type = sa.DateTime()
    inherit_cache = True


@compiles(_date_add_microseconds)
def _compile_date_add(element: Any, compiler: Any, **kw: Any) -> str:
    when, micros = list(element.clauses)
    return (
        f"DATE_ADD({compiler.process(when, **kw)}, "
        f"INTERVAL {compiler.process(micros, **kw)} MICROSECOND)"
    )


def _probe(cursor: Any) -> tuple[int, ...]:
    """The SingleStore version, or () when the server is not SingleStore."""
    try:
        cursor.execute("SELECT @@memsql_version")  # no Core construct for a system variable
        row = cursor.fetchone()
    except Exception:  # "unknown system variable": MySQL or MariaDB
        return ()
    text = str(row[0] if row else "").split("-")[0]
    return tuple(int(part) for part in text.split(".") if part.isdigit()) or (0,)


class SingleStoreDialect(Dialect):
    name = "singlestore"
    sqlalchemy_names = ("singlestoredb",)
    url_driver = "singlestoredb"
    default_port = 3306
    default_strategy = "lock_server"

    supports_skip_locked = False
    supports_named_locks = False
    supports_savepoints = False
    returns_inserted_ids = False
    insert_sets_times = True
    version_table_pk = False

    # ---- which server -------------------------------------------------------------------------
    @property
    def singlestore_version(self) -> tuple[int, ...] | None:
        """SingleStore's version; () for a MySQL-compatible stand-in; None if not asked yet."""
        return self.sa_dialect.__dict__.get(_FLAVOUR)

    def identify(self, conn: Connection | None) -> bool:
        """Whether the server is SingleStore (asked once). With no connection — a migration
        printing its SQL — the script is meant for SingleStore: True."""
        if self.singlestore_version is None and conn is not None:
            cursor = conn.connection.driver_connection.cursor()
            try:
                self.sa_dialect.__dict__[_FLAVOUR] = _probe(cursor)
            finally:
                cursor.close()
        return self.singlestore_version != ()

    @property
    def server_description(self) -> str:
        version = self.singlestore_version
        if version:
            return f"SingleStore {'.'.join(map(str, version))}"
        numbers = ".".join(map(str, self.server_version)) or "(unknown version)"
        if version == ():
            flavour = "MariaDB" if getattr(self.sa_dialect, "is_mariadb", False) else "MySQL"
            return f"{flavour} {numbers} through the singlestoredb driver (the SingleStore path)"
        return f"SingleStore (MySQL protocol {numbers})"

    def skip_locked_unsupported_reason(self) -> str:
        return (
            "SingleStore has no SELECT ... FOR UPDATE SKIP LOCKED; use --strategy lock_server "
            "(its default)"
        )

    def named_locks_unsupported_reason(self) -> str:
        return (
            "SingleStore has no named locks (no GET_LOCK); use --strategy lock_server (its default)"
        )

    # ---- SQL that differs ---------------------------------------------------------------------
    def now(self) -> ColumnElement:
        return sa.func.utc_timestamp(sa.literal_column("6"))

    def now_plus(self, seconds: float | ColumnElement) -> ColumnElement:
        # No CAST to FLOAT: this dialect renders it as ``x :> FLOAT``, which MySQL-compatible
        # servers reject; an integer CAST renders as CAST(x AS SIGNED INTEGER) everywhere.
        if isinstance(seconds, ColumnElement):
            value: ColumnElement = sa.type_coerce(seconds, sa.Float())
        else:
            value = sa.literal(float(seconds), sa.Float())
        micros = sa.cast(value * 1_000_000, sa.BigInteger())
        return _date_add_microseconds(self.now(), micros)

    def json_list_append(
        self, column: ColumnElement, entry: ColumnElement, keep: int
    ) -> ColumnElement:
        # SingleStore has no JSON_ARRAY_APPEND, and its JSON_ARRAY_PUSH_JSON is unknown to the
        # MySQL-compatible servers this module also serves; the column is LONGTEXT here. So the
        # list is written as text, one entry per line ("[\n{…},\n{…}\n]"): JSON escapes a
        # newline inside a string, so a line break only ever separates entries, and string
        # functions both servers have can count them, drop the first and append.
        stamp = sa.func.date_format(self.now(), "%Y-%m-%dT%H:%i:%s.%fZ")
        item = sa.func.concat('{"at":"', stamp, '",', sa.func.substring(entry, 2))
        length = sa.func.char_length(column)
        lines = length - sa.func.char_length(sa.func.replace(column, "\n", ""))
        head = sa.func.substring(column, 1, length - 2)  # without its closing "\n]"
        after_first = sa.func.substring(head, sa.func.locate(",\n", column) + 2)
        return sa.case(
            (column.is_(None), sa.func.concat("[\n", item, "\n]")),
            (lines > keep, sa.func.concat("[\n", after_first, ",\n", item, "\n]")),
            else_=sa.func.concat(head, ",\n", item, "\n]"),
        )

    def insert_unless_present(self, table: sa.Table) -> sa.Insert:
        # INSERT IGNORE discards a row whose key exists (SingleStore's INSERT documentation).
        return sa.insert(table).prefix_with("IGNORE")

    upsert_rowcount_tells = True

    def insert_or_count(self, table: sa.Table, counter: str) -> sa.Insert:
        # ON DUPLICATE KEY UPDATE works as on MySQL, on any column but the shard key.
        return mysql.insert(table).on_duplicate_key_update({counter: table.c[counter] + 1})

    def add_to_counter(self, table: sa.Table, counter: str) -> sa.Insert:
        # ON DUPLICATE KEY UPDATE works on any key but the shard key's columns (not updated here).
        stmt = mysql.insert(table)
        return stmt.on_duplicate_key_update({counter: table.c[counter] + stmt.inserted[counter]})

    def claim_order(self, jobs: sa.Table) -> list[ColumnElement]:
        # AUTO_INCREMENT ids are unique per aggregator, not ordered across them.
        return [jobs.c.priority, jobs.c.run_at, jobs.c.created_at]

    # ---- column types -------------------------------------------------------------------------
    @classmethod
    def json_type(cls) -> sa.types.TypeEngine:
        return _JsonLongText()

    @classmethod
    def timestamp_type(cls) -> sa.types.TypeEngine:
        return mysql.DATETIME(fsp=6)

    @classmethod
    def server_now_default(cls) -> Any:
        return sa.text("CURRENT_TIMESTAMP(6)")

    # ---- DDL ----------------------------------------------------------------------------------
    def table_options(self, conn: Connection | None, key: str) -> dict[str, Any]:
        if not self.identify(conn):
            return {}  # a MySQL-compatible stand-in: plain CREATE TABLE
        # A sharded rowstore (not a columnstore, SingleStore's default, nor a reference table,
        # which replicates asynchronously), sharded on the primary key: the only unique key.
        return {"singlestoredb_table_type": RowStore(), "singlestoredb_shard_key": ShardKey(key)}

    # ---- engines ------------------------------------------------------------------------------
    @classmethod
    def engine_kwargs(cls) -> dict[str, Any]:
        return {"pool_pre_ping": True}

    @classmethod
    def normalize_url(cls, url: sa.engine.URL) -> sa.engine.URL:
        value = url.query.get("autocommit")
        if value is None:
            return url.update_query_dict({"autocommit": "false"})
        if str(value).lower() in _TRUE:
            raise ConfigurationError(
                "the singlestoredb URL asks for autocommit=true, but dbqueue needs transactions "
                "(a rollback must undo): remove autocommit from the URL"
            )
        return url

    @classmethod
    def configure_engine(cls, engine: Engine) -> None:
        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection: Any, record: Any) -> None:
            cursor = dbapi_connection.cursor()
            try:
                version = _probe(cursor)
                engine.dialect.__dict__[_FLAVOUR] = version
                if not version:  # SingleStore runs READ COMMITTED only; make a stand-in match
                    cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            finally:
                cursor.close()
            dbapi_connection.rollback()

    def check_connection(self, conn: Connection) -> None:
        get_autocommit = getattr(conn.connection.driver_connection, "get_autocommit", None)
        if get_autocommit is not None and get_autocommit():
            raise ConfigurationError(
                "this singlestoredb connection autocommits, so a rollback would undo nothing: "
                "add ?autocommit=false to the URL (or connect_args={'autocommit': False})"
            )

    # ---- errors -------------------------------------------------------------------------------
    def end_connection(self, engine: Engine, dbapi_connection: Any) -> bool:
        # SingleStore has KILL CONNECTION too (the id is the aggregator's, from the handshake).
        return kill_connection(engine, dbapi_connection)

    def is_missing_table(self, exc: BaseException) -> bool:
        return driver_code(exc) == _NO_SUCH_TABLE

    def is_transient(self, exc: BaseException) -> bool:
        return driver_code(exc) in _TRANSIENT

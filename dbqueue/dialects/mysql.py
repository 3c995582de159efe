"""MySQL ≥ 8.0.1 and MariaDB ≥ 10.6: SKIP LOCKED claims, GET_LOCK named locks, polling.

Times are stored as UTC in DATETIME(6) columns and compared with UTC_TIMESTAMP(6), so the server's
and the session's time zones never matter (TIMESTAMP would convert, and stops at 2038).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.elements import ColumnElement

from dbqueue.dialects.base import (
    Dialect,
    driver_code,
    seconds_expression,
    with_driver,
)
from dbqueue.schema.types import NativeJson

_NO_SUCH_TABLE = 1146
_TRANSIENT = {1205, 1213}  # lock wait timeout, deadlock


_MAX_LOCK_NAME = 64


def lock_name(name: str) -> str:
    """GET_LOCK names are limited to 64 characters: long ones are replaced by a hash."""
    if len(name) <= _MAX_LOCK_NAME:
        return name
    return "dbqueue:" + hashlib.blake2b(name.encode(), digest_size=24).hexdigest()


def kill_connection(engine: Engine, dbapi_connection: Any) -> bool:
    """KILL CONNECTION (MySQL, MariaDB, SingleStore), not KILL QUERY: a handler blocked outside
    the database has no query to kill, and the session must end to release its row locks and
    named locks. KILL has no SQLAlchemy construct; the id is a bound parameter all the same."""
    # From the handshake, no round trip: PyMySQL's, or aiomysql's (an async worker's connection,
    # under SQLAlchemy's adapter).
    driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
    thread_id = int(driver.thread_id())
    with engine.connect() as conn:
        conn.execute(sa.text("KILL CONNECTION :id"), {"id": thread_id})
        conn.commit()
    return True


#: Rows whose ids read back (RETURNING, parsed by PyMySQL) cost more than one round trip.
_ROWS_WORTH_ASKING = 100
_AUTOINC_SETTINGS = sa.select(
    sa.literal_column("@@innodb_autoinc_lock_mode"),
    sa.literal_column("@@auto_increment_increment"),
)


def _ids_from(first: Any, count: int) -> range:
    return range(int(first), int(first) + count)


class MySQLDialect(Dialect):
    name = "mysql"
    sqlalchemy_names = ("mysql", "mariadb")
    url_driver = "mysql+pymysql"
    async_driver = "aiomysql"
    sync_drivers = {"aiomysql": "pymysql", "asyncmy": "pymysql"}
    default_port = 3306
    default_strategy = "skip_locked"

    supports_named_locks = True

    @property
    def is_mariadb(self) -> bool:
        return bool(getattr(self.sa_dialect, "is_mariadb", False))

    @property
    def server_description(self) -> str:
        flavour = "MariaDB" if self.is_mariadb else "MySQL"
        return f"{flavour} {'.'.join(map(str, self.server_version)) or '(unknown version)'}"

    @property
    def supports_skip_locked(self) -> bool:  # type: ignore[override]
        # MariaDB added SKIP LOCKED in 10.6, MySQL in 8.0.1.
        minimum = (10, 6) if self.is_mariadb else (8, 0, 1)
        return self.server_version >= minimum

    def consecutive_ids(self, conn: Connection, count: int) -> Callable[[Any, int], range] | None:
        # A multi-row INSERT (a "simple insert": its row count known) gets consecutive ids when
        # InnoDB's auto-increment lock mode is 0 or 1 (MariaDB's default; Galera and MySQL 8
        # use 2, interleaved) and the session's increment is 1; lastrowid is the first row's.
        # Asked on each call (a session may change its increment): only where that round trip
        # costs less than reading the ids back.
        if count < _ROWS_WORTH_ASKING:
            return None
        mode, step = conn.execute(_AUTOINC_SETTINGS).one()
        return _ids_from if int(mode) <= 1 and int(step) == 1 else None

    def skip_locked_unsupported_reason(self) -> str:
        return (
            f"{self.server_description} has no SELECT ... FOR UPDATE SKIP LOCKED "
            "(it needs MySQL >= 8.0.1 or MariaDB >= 10.6); use --strategy advisory_lock "
            "or --strategy lock_server"
        )

    def now(self) -> ColumnElement:
        return sa.func.utc_timestamp(sa.literal_column("6"))

    def now_plus(self, seconds: float | ColumnElement) -> ColumnElement:
        micros = sa.cast(seconds_expression(seconds) * 1_000_000, sa.BigInteger())
        return sa.func.timestampadd(sa.literal_column("MICROSECOND"), micros, self.now())

    def json_list_append(
        self, column: ColumnElement, entry: ColumnElement, keep: int
    ) -> ColumnElement:
        # JSON_SET's result is JSON to JSON_ARRAY_APPEND (an object, not a quoted string) on
        # MySQL and on MariaDB alike; ranges of paths ("$[1 to last]") would need MariaDB 10.9.
        stamp = sa.func.date_format(self.now(), "%Y-%m-%dT%H:%i:%s.%fZ")
        item = sa.func.json_set(entry, "$.at", stamp)
        listed = sa.func.coalesce(column, sa.func.json_array())
        kept = sa.case(
            (sa.func.json_length(listed) >= keep, sa.func.json_remove(listed, "$[0]")),
            else_=listed,
        )
        return sa.func.json_array_append(kept, "$", item)

    def unindexed(self, column: sa.ColumnElement) -> ColumnElement:
        # A batch's guarded UPDATE (id IN (…) AND status = 'available'): with status
        # sargable the range optimizer also dives into the claim index, whose head pages every
        # claimer is latching; with 32 claimers on two cores that was 3% of the server's CPU
        # (perf), part of it spinning. CONCAT(status, '') leaves only the primary key.
        return sa.func.concat(column, sa.literal_column("''"))

    def insert_unless_present(self, table: sa.Table) -> sa.Insert:
        # INSERT IGNORE: a duplicate key becomes a warning and 0 rows (ON DUPLICATE KEY UPDATE
        # cannot tell an insert from a no-op: SQLAlchemy's client flag FOUND_ROWS counts both
        # as 1). It would also turn other errors into warnings; dbqueue validates the values.
        return sa.insert(table).prefix_with("IGNORE")

    upsert_rowcount_tells = True

    def insert_or_count(self, table: sa.Table, counter: str) -> sa.Insert:
        # Affected rows: 1 inserted, 2 updated (the counter always changes, so FOUND_ROWS,
        # which SQLAlchemy sets, cannot turn an update into a 1).
        return mysql.insert(table).on_duplicate_key_update({counter: table.c[counter] + 1})

    def add_to_counter(self, table: sa.Table, counter: str) -> sa.Insert:
        # No RETURNING here (MySQL 8): the caller reads the counter back, its own write.
        stmt = mysql.insert(table)
        return stmt.on_duplicate_key_update({counter: table.c[counter] + stmt.inserted[counter]})

    def try_lock(self, name: str) -> ColumnElement:
        # GET_LOCK(name, 0): connection-scoped, survives commit and rollback, never waits.
        return sa.func.get_lock(sa.literal(lock_name(name)), sa.literal_column("0"))

    def unlock(self, name: str) -> ColumnElement:
        return sa.func.release_lock(sa.literal(lock_name(name)))

    def try_lock_named_by(self, prefix: str) -> Callable[[ColumnElement], ColumnElement] | None:
        # The same name as try_lock's as long as lock_name keeps it whole: a BIGINT has at most
        # 20 characters.
        if len(prefix) + 20 > _MAX_LOCK_NAME:
            return None

        def lock(key: ColumnElement) -> ColumnElement:
            name = sa.func.concat(sa.literal(prefix), key)
            return sa.func.get_lock(name, sa.literal_column("0"))

        return lock

    def end_connection(self, engine: Engine, dbapi_connection: Any) -> bool:
        return kill_connection(engine, dbapi_connection)

    @classmethod
    def json_type(cls) -> sa.types.TypeEngine:
        return NativeJson("JSON")  # validated by the server; PyMySQL returns text

    @classmethod
    def timestamp_type(cls) -> sa.types.TypeEngine:
        return mysql.DATETIME(fsp=6)

    @classmethod
    def server_now_default(cls) -> Any:
        return sa.text("(UTC_TIMESTAMP(6))")

    def table_options(self, conn: Any, key: str) -> dict[str, Any]:
        # Binary collation: queue and task names compare exactly, as on the other databases.
        return {
            "mysql_engine": "InnoDB",
            "mysql_charset": "utf8mb4",
            "mysql_collate": "utf8mb4_bin",
        }

    @classmethod
    def engine_kwargs(cls) -> dict[str, Any]:
        # READ COMMITTED: the claim's locking read takes no gap locks (fewer deadlocks with
        # concurrent inserts), and a transaction sees jobs committed after it began.
        # The pool's reset: see _reset_on_return.
        return {
            "pool_pre_ping": True,
            "isolation_level": "READ COMMITTED",
            "pool_reset_on_return": None,
        }

    @classmethod
    def configure_engine(cls, engine: Engine) -> None:
        super().configure_engine(engine)
        sa.event.listen(engine, "reset", _reset_on_return)

    @classmethod
    def normalize_url(cls, url: sa.engine.URL) -> sa.engine.URL:
        # With no driver named SQLAlchemy picks mysqlclient (MySQLdb), a C extension dbqueue does
        # not install; PyMySQL it does. mariadb:// becomes mysql://: SQLAlchemy's "mariadb"
        # dialect ignores the mysql_* table options (the binary collation that makes names
        # compare exactly), and its "mysql" dialect recognises a MariaDB server anyway.
        return with_driver(url, "mysql", "pymysql")

    def is_missing_table(self, exc: BaseException) -> bool:
        return driver_code(exc) == _NO_SUCH_TABLE

    def is_transient(self, exc: BaseException) -> bool:
        return driver_code(exc) in _TRANSIENT


#: PyMySQL's record of the server's last status flags (from every OK/EOF packet).
_SERVER_STATUS_IN_TRANS = 1


def _reset_on_return(dbapi_connection: Any, record: Any, state: Any) -> None:
    """The pool's reset of a returned connection, without its round trip after a commit:
    PyMySQL sends ROLLBACK whether or not a transaction is open (psycopg2 and sqlite3 do
    not), which cost ``app.enqueue(None, …)`` a fourth of its time. The server reports in every
    reply whether a transaction is open; roll back when it is, or when the driver does not
    say (another driver), as SQLAlchemy's own reset would."""
    if not state.asyncio_safe:
        return
    status = getattr(dbapi_connection, "server_status", None)
    if type(status) is not int or status & _SERVER_STATUS_IN_TRANS:
        dbapi_connection.rollback()

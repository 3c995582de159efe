"""PostgreSQL ≥ 12: SKIP LOCKED claims, advisory locks, LISTEN/NOTIFY wake-ups."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.elements import ColumnElement

from dbqueue.base.wakeup import Notifier
from dbqueue.dialects.base import (
    Dialect,
    driver_code,
    seconds_expression,
    with_driver,
)
from dbqueue.dialects.pg_listen import PgFinishListener, PgNotifier
from dbqueue.schema.types import JsonText, NativeJson

_UNDEFINED_TABLE = "42P01"
_UTC = dt.timezone.utc
_TRANSIENT = {"40001", "40P01", "55P03"}  # serialization failure, deadlock, lock not available
_TRANSACTION_IDLE = 0  # psycopg2.extensions.TRANSACTION_STATUS_IDLE: no transaction open


#: A name ending in a number of up to this many digits (a job's id) is keyed by that number.
_MAX_NUMBER_DIGITS = 19
_BIGINT_END = 2**63


def lock_key(name: str) -> int:
    """Advisory locks take a bigint: the name's 64-bit hash, or, for a name ending in a number
    (a job's lock), its stem's hash XOR the number: SQL can then key a job's lock from its id
    (``try_lock_named_by``), and a stem's numbers never collide with one another.

    A collision can only make a lock look taken when it is not (a job waits a round longer),
    never let two holders share one.
    """
    stem = name.rstrip("0123456789")
    digits = name[len(stem) :]
    if not digits or len(digits) > _MAX_NUMBER_DIGITS or int(digits) >= _BIGINT_END:
        return _hash64(name)
    return _hash64(stem) ^ int(digits)


def _hash64(text: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(text.encode(), digest_size=8).digest(), "big", signed=True
    )


class PostgresDialect(Dialect):
    name = "postgresql"
    sqlalchemy_names = ("postgresql",)
    # Heroku, Render and libpq's own URIs say postgres://, a name SQLAlchemy dropped in 1.4.
    url_aliases = ("postgres",)
    url_driver = "postgresql+psycopg2"
    async_driver = "asyncpg"
    sync_drivers = {"asyncpg": "psycopg2", "psycopg_async": "psycopg"}
    default_port = 5432
    default_strategy = "skip_locked"

    supports_skip_locked = True
    supports_named_locks = True
    supports_listen_notify = True
    finishes_pushed = True
    writes_in_with = True

    def now(self) -> ColumnElement:
        # statement_timestamp(), not now(): now() is frozen at the start of the transaction, and
        # a batch transaction lives for as long as its handlers run.
        return sa.func.statement_timestamp()

    def insert_unless_present(self, table: sa.Table) -> sa.Insert:
        return postgresql.insert(table).on_conflict_do_nothing()

    def insert_or_count(self, table: sa.Table, counter: str) -> sa.Insert:
        stmt = postgresql.insert(table)
        return stmt.on_conflict_do_update(
            index_elements=list(table.primary_key.columns),
            set_={counter: table.c[counter] + 1},
        )

    counter_returned = True

    def add_to_counter(self, table: sa.Table, counter: str) -> sa.Insert:
        stmt = postgresql.insert(table)
        keys = [column.name for column in table.primary_key]
        return stmt.on_conflict_do_update(
            index_elements=keys, set_={counter: table.c[counter] + stmt.excluded[counter]}
        )

    def now_plus(self, seconds: float | ColumnElement) -> ColumnElement:
        return self.now() + sa.func.make_interval(0, 0, 0, 0, 0, 0, seconds_expression(seconds))

    def columnar_insert(self, table: sa.Table, columns: Sequence[str]) -> sa.Insert:
        # INSERT … SELECT FROM unnest(:a, :b, …): one array per column, so the statement's text
        # and parse cost stay the same however many rows it carries (a 1,000-row VALUES list
        # has 6,000 parameters to send and parse). unnest yields the rows in array order.
        # Each array travels as one text parameter in array-literal form, cast by the server:
        # psycopg2 adapts a Python list element by element (14 µs per row, measured), this
        # costs a join; bulk enqueue goes from 20k to 50k rows/s on the raw statement.
        arrays = [
            sa.cast(sa.bindparam(name, type_=ArrayLiteral()), postgresql.ARRAY(table.c[name].type))
            for name in columns
        ]
        rows = sa.func.unnest(*arrays).table_valued(*columns).render_derived()
        return sa.insert(table).from_select(list(columns), sa.select(*rows.c))

    def payload_read(self, column: sa.ColumnElement) -> ColumnElement:
        # As text, decoded by dbqueue: psycopg2 decodes jsonb through a Python-level typecaster
        # that first decodes the bytes with a Python codec call (a tenth of a no-op job's CPU).
        return sa.type_coerce(sa.cast(column, sa.Text()), JsonText()).label(column.name)

    def in_list(self, column: sa.ColumnElement, name: str) -> ColumnElement:
        # One array parameter: the statement text stays the same whatever the list's length
        # (an expanding IN is re-rendered on every execution).
        return column == sa.any_(sa.bindparam(name, type_=postgresql.ARRAY(column.type)))

    def unindexed(self, column: sa.ColumnElement) -> ColumnElement:
        # A queue table's statistics lag behind it (a fresh table has none until autoanalyze):
        # the planner then takes ``status = 'available'`` through the claim index over
        # ``id = ANY(…)`` through the primary key, and each batch's UPDATE walks every runnable
        # job's index entry — a thousand per job on 20,000 queued. status || '' has no index.
        return column.op("||")(sa.literal_column("''"))

    def try_lock(self, name: str) -> ColumnElement:
        return sa.func.pg_try_advisory_lock(sa.literal(lock_key(name), sa.BigInteger()))

    def unlock(self, name: str) -> ColumnElement:
        return sa.func.pg_advisory_unlock(sa.literal(lock_key(name), sa.BigInteger()))

    def try_lock_named_by(self, prefix: str) -> Callable[[ColumnElement], ColumnElement] | None:
        # lock_key(prefix + str(key)) for a key that is a bigint, never negative (a job's id):
        # the stem's hash XOR the key.
        stem = sa.literal(_hash64(prefix), sa.BigInteger())

        def lock(key: ColumnElement) -> ColumnElement:
            return sa.func.pg_try_advisory_lock(stem.op("#")(key))

        return lock

    @contextlib.contextmanager
    def one_statement_transaction(self, conn: Connection) -> Iterator[None]:
        # The driver's autocommit: each statement its own transaction, with no BEGIN sent
        # first nor COMMIT after (SQLAlchemy's transaction is then bookkeeping). set_config's
        # is_local still holds for the statement's own transaction (commit_unflushed).
        dbapi = conn.connection.dbapi_connection
        if conn.in_transaction() or not hasattr(dbapi, "autocommit"):
            with conn.begin():
                yield
            return
        with _autocommit(dbapi), conn.begin():
            yield

    @contextlib.contextmanager
    def statements_alone(self, conn: Connection) -> Iterator[None]:
        # psycopg2 sends BEGIN before a transaction's first statement: a transaction with none
        # yet is idle on the server, and its statements can run in autocommit instead. The
        # COMMIT that ends it afterwards then has nothing to send.
        dbapi = conn.connection.dbapi_connection
        status = getattr(dbapi, "get_transaction_status", None)
        if status is None or dbapi.autocommit or status() != _TRANSACTION_IDLE:
            yield
            return
        with _autocommit(dbapi):
            yield

    @contextlib.contextmanager
    def statements_together(self, conn: Connection) -> Iterator[None]:
        # In the driver's autocommit no transaction is open on the server: turning it off
        # begins one with the block's first statement, committed here; the caller's
        # SQLAlchemy transaction, bookkeeping only, then has nothing left to commit.
        dbapi = conn.connection.dbapi_connection
        if not getattr(dbapi, "autocommit", False):
            yield
            return
        dbapi.autocommit = False
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):  # a broken connection: the server rolled back
                dbapi.rollback()
            raise
        else:
            dbapi.commit()
        finally:
            with contextlib.suppress(Exception):
                dbapi.autocommit = True

    def unlock_named_by(self, prefix: str) -> sa.Select | None:
        # One array parameter, whatever the number of keys: the statement is compiled once.
        stem = sa.literal(_hash64(prefix), sa.BigInteger())
        keys = sa.bindparam("keys", type_=postgresql.ARRAY(sa.BigInteger()))
        listed = sa.func.unnest(keys).table_valued("key").render_derived()
        unlocked = sa.func.pg_advisory_unlock(stem.op("#")(listed.c.key))
        return sa.select(sa.func.count(unlocked)).select_from(listed)

    def commit_unflushed(self) -> ColumnElement:
        # synchronous_commit=off for this transaction only (set_config's is_local): its commit
        # is visible at once and durable within wal_writer_delay, or with any later flush.
        return sa.func.set_config("synchronous_commit", "off", sa.true())

    def end_connection(self, engine: Engine, dbapi_connection: Any) -> bool:
        # Terminate, not cancel: a handler blocked outside the database (time.sleep) has no
        # query to cancel, and its session must end to release its row and advisory locks.
        # Known to the driver from the handshake, no round trip: psycopg2's libpq, or asyncpg's
        # (an async worker's connection, SQLAlchemy's adapter around it).
        backend_pid = getattr(dbapi_connection, "get_backend_pid", None)
        pid = backend_pid() if backend_pid else dbapi_connection.driver_connection.get_server_pid()
        with engine.connect() as conn:
            ended = conn.execute(sa.select(sa.func.pg_terminate_backend(pid))).scalar()
            conn.commit()
        return bool(ended)

    def notifier(self, engine: Engine, channel: str) -> Notifier:
        return PgNotifier(engine, channel)

    def announcement(self) -> sa.Executable | None:
        channel, message = (sa.bindparam(name, type_=sa.Text()) for name in ("channel", "message"))
        return sa.select(sa.func.pg_notify(channel, message))

    def finish_listener(
        self, engine: Engine, channel: str, on_finished: Callable[[list[int] | None], None]
    ) -> Notifier | None:
        return PgFinishListener(engine, channel, on_finished)

    def json_value(self, value: ColumnElement) -> ColumnElement:
        # A CASE of text parameters is text, which a jsonb column does not take without a cast.
        return sa.cast(value, postgresql.JSONB)

    def json_list_append(
        self, column: ColumnElement, entry: ColumnElement, keep: int
    ) -> ColumnElement:
        stamp = sa.func.to_char(
            sa.func.timezone("UTC", self.now()), 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'
        )
        item = sa.cast(entry, postgresql.JSONB).op("||")(sa.func.jsonb_build_object("at", stamp))
        listed = sa.func.coalesce(column, sa.cast(sa.literal("[]", sa.Text()), postgresql.JSONB))
        # jsonb minus an integer drops the element at that index.
        first = listed.op("-")(sa.literal(0, sa.Integer()))
        kept = sa.case((sa.func.jsonb_array_length(listed) >= keep, first), else_=listed)
        return kept.op("||")(sa.func.jsonb_build_array(item))

    @classmethod
    def json_type(cls) -> sa.types.TypeEngine:
        return NativeJson("JSONB", driver_decodes=True)

    @classmethod
    def timestamp_type(cls) -> sa.types.TypeEngine:
        return postgresql.TIMESTAMP(timezone=True)

    @classmethod
    def server_now_default(cls) -> Any:
        return sa.func.now()

    @classmethod
    def normalize_url(cls, url: sa.engine.URL) -> sa.engine.URL:
        # With no driver named SQLAlchemy 2.1 picks psycopg (3); dbqueue installs psycopg2, whose
        # notification polling and backend pid the wake-ups and timeouts use.
        return with_driver(url, "postgresql", "psycopg2")

    def is_missing_table(self, exc: BaseException) -> bool:
        return driver_code(exc) == _UNDEFINED_TABLE

    def is_transient(self, exc: BaseException) -> bool:
        return driver_code(exc) in _TRANSIENT

    def connection_lost(self, exc: BaseException) -> bool:
        # asyncpg sets up a new connection (its JSON codecs) in SQLAlchemy's connect hook, where
        # a server that restarts meanwhile surfaces as asyncpg's own InterfaceError, unwrapped.
        try:
            from asyncpg import exceptions
        except ImportError:  # no asyncio extra: the error cannot be asyncpg's
            return False
        if isinstance(exc, exceptions.ConnectionDoesNotExistError):
            return True
        return isinstance(exc, exceptions.InterfaceError) and "connection is closed" in str(exc)


class ArrayLiteral(sa.types.TypeDecorator):
    """A list bound as PostgreSQL's array-literal text (``{"a","b\\"c",NULL}``); the SQL casts it
    to the element type's array. Still a bound parameter: quoting here is the array syntax's,
    not SQL's."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if value is None:
            return None
        if not value:
            return "{}"
        try:  # the common case, every element a string: one join
            return '{"' + '","'.join(_quoted(v) for v in value) + '"}'
        except (AttributeError, TypeError):  # a None, number, boolean or datetime among them
            return "{" + ",".join(map(_array_element, value)) + "}"


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _array_element(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return '"' + _quoted(value) + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware datetime")
        return '"' + value.astimezone(_UTC).isoformat() + '"'
    raise TypeError(f"cannot put a {type(value).__name__} in a PostgreSQL array literal")


@contextlib.contextmanager
def _autocommit(dbapi: Any) -> Iterator[None]:
    """The driver's autocommit for the block (each statement commits as it runs), then off."""
    dbapi.autocommit = True
    try:
        yield
    finally:
        # A connection closed by the failure that ended the block refuses: invalidated.
        with contextlib.suppress(Exception):
            dbapi.autocommit = False

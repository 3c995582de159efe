"""The interface every database module implements.

A Dialect holds each thing that differs between databases — clock expressions, column types,
engine set-up, error classification and capability flags read from the server version — so the
engine and everything above it never test a database's name (SQLAlchemy's own dialects work the
same way: ``supports_*`` flags filled in when the first connection reveals the version).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.engine.interfaces import Dialect as SADialect
from sqlalchemy.sql.elements import ColumnElement

from dbqueue.base.wakeup import Notifier, PollingOnly
from dbqueue.errors import StrategyNotSupportedError
from dbqueue.schema import types as sqltypes

#: Execution option marking a transaction that will read, then write (a claim): databases that
#: lock per transaction (SQLite) take their write lock when it begins.
WRITE_INTENT = "dbqueue_write_intent"


class Dialect(abc.ABC):
    #: dbqueue's name for the database (the ``--dialect`` choice).
    name: ClassVar[str]
    #: SQLAlchemy dialect names this module serves.
    sqlalchemy_names: ClassVar[tuple[str, ...]]
    #: Other names a URL may give the database before ``+driver`` (``normalize_url`` maps them).
    url_aliases: ClassVar[tuple[str, ...]] = ()
    #: driver part of URLs built from DB_HOST/DB_PORT/... variables.
    url_driver: ClassVar[str]
    default_port: ClassVar[int | None] = None
    #: the asyncio driver async handlers and async enqueue use (``dbqueue-sql[asyncio]``), None:
    #: the database has no async path.
    async_driver: ClassVar[str | None] = None
    #: asyncio driver → the sync driver of the same database, for an async URL given where a
    #: sync engine is needed (the App's own engine, the command line).
    sync_drivers: ClassVar[dict[str, str]] = {}
    #: claim strategy used when none is asked for.
    default_strategy: ClassVar[str]

    def __init__(self, sa_dialect: SADialect) -> None:
        self.sa_dialect = sa_dialect
        self.server_version: tuple = tuple(
            v for v in (sa_dialect.server_version_info or ()) if isinstance(v, int)
        )

    # ---- capabilities (may depend on the server version) -------------------------------------
    supports_skip_locked: bool = False
    supports_savepoints: bool = True
    supports_named_locks: bool = False
    supports_listen_notify: bool = False
    #: a caller waiting for a job's end (``app.call``) is told of it (``finish_listener``).
    finishes_pushed: bool = False
    #: the database admits one writer at a time (SQLite): a write transaction is exclusive.
    single_writer: bool = False
    #: ALTER TABLE is too limited: Alembic must rebuild tables ("batch" mode, SQLite).
    needs_batch_alter: bool = False
    #: A multi-row INSERT may return the new ids (RETURNING), where the driver supports it.
    returns_inserted_ids: bool = True
    #: dbqueue's own INSERTs write created_at/run_at/updated_at from ``now()`` instead of
    #: relying on the column defaults (where a DDL default cannot be the UTC clock).
    insert_sets_times: bool = False
    #: Alembic's version table may have a primary key (its UPDATE changes that key).
    version_table_pk: bool = True

    def consecutive_ids(self, conn: Connection, count: int) -> Callable[[Any, int], range] | None:
        """Where a multi-row INSERT of ``count`` rows on ``conn`` gives them consecutive ids
        in VALUES order: how those follow from the driver's ``lastrowid`` and the row count.
        The ids are then known without RETURNING, which costs a bulk enqueue a sixth of its
        time on SQLite and MariaDB. None: they may not be consecutive (or not worth asking)."""
        return None

    @property
    def server_description(self) -> str:
        return f"{self.name} {'.'.join(map(str, self.server_version)) or '(unknown version)'}"

    def skip_locked_unsupported_reason(self) -> str:
        return f"{self.server_description} has no SELECT ... FOR UPDATE SKIP LOCKED"

    def named_locks_unsupported_reason(self) -> str:
        return f"{self.server_description} has no connection-scoped named (advisory) locks"

    # ---- SQL that differs ---------------------------------------------------------------------
    @abc.abstractmethod
    def now(self) -> ColumnElement:
        """The database's current UTC time, the one clock all workers agree on."""

    @abc.abstractmethod
    def now_plus(self, seconds: float | ColumnElement) -> ColumnElement:
        """``now()`` moved by a number of seconds: a Python number (bound as a parameter, never
        SQL text) or a SQL expression such as a ``bindparam`` for executemany."""

    def claim_order(self, jobs: sa.Table) -> list[ColumnElement]:
        """The order jobs are claimed in: priority, then run_at, then id (insertion order)."""
        return [jobs.c.priority, jobs.c.run_at, jobs.c.id]

    def columnar_insert(self, table: sa.Table, columns: Sequence[str]) -> sa.Insert | None:
        """A multi-row INSERT taking one list parameter per column (each named after its
        column), where the database has one; None: SQLAlchemy's multi-row VALUES is used."""
        return None

    def in_list(self, column: sa.ColumnElement, name: str) -> ColumnElement:
        """``column IN (…)`` over a list bound as parameter ``name``."""
        return column.in_(sa.bindparam(name, expanding=True))

    def unindexed(self, column: sa.ColumnElement) -> ColumnElement:
        """The column in a form the planner will not look up through an index: for a guard
        such as ``status = 'running'`` next to ``id IN (…)``, which must not steer the plan."""
        return column

    def take_write_lock(self, conn: Any, table: sa.Table) -> None:
        """Before a transaction's first read, where it will write: on a single-writer database
        a transaction that reads first cannot wait for the write lock later (SQLite's WAL
        refuses at once once another writer has committed since the read began)."""

    @abc.abstractmethod
    def insert_unless_present(self, table: sa.Table) -> sa.Insert:
        """An INSERT of one row that, when the table already holds a row with the same primary
        key (or another transaction inserts one and commits), inserts nothing and raises
        nothing: rowcount 0 instead of a duplicate-key error, which a database may log and
        which would end the transaction. A periodic tick met by several workers uses it."""

    #: ``insert_or_count`` tells by its rowcount whether it inserted (1) or counted on an
    #: existing row (2), like MySQL's ON DUPLICATE KEY UPDATE; False: it returns its row's
    #: ``returning`` columns instead (RETURNING), and the caller compares them.
    upsert_rowcount_tells: bool = False

    @abc.abstractmethod
    def insert_or_count(self, table: sa.Table, counter: str) -> sa.Insert:
        """An INSERT of one row that, when a row with the same primary key exists (or another
        transaction inserts one and commits), adds 1 to that row's ``counter`` instead, which
        locks the row for the rest of the transaction. Unlike INSERT IGNORE it takes no shared
        lock that two transactions would then both upgrade (MySQL's classic deadlock).
        Unique jobs take their key with it."""

    @abc.abstractmethod
    def add_to_counter(self, table: sa.Table, counter: str) -> sa.Insert:
        """An INSERT of one row that, when a row with the same primary key exists (or another
        transaction inserts one and commits), adds the row's ``counter`` value to that row's
        instead, taking its row lock. A key's line numbers its jobs with it."""

    #: ``add_to_counter`` may RETURN the new values (else the caller reads them back).
    counter_returned: bool = False

    def payload_read(self, column: sa.ColumnElement) -> ColumnElement:
        """The payload column as a claim reads it (decoded by its type's result processing)."""
        return column

    # ---- named locks (connection-scoped; only when supports_named_locks) ---------------------
    def try_lock(self, name: str) -> ColumnElement:
        """Expression taking the named lock without waiting; true when it was taken."""
        raise StrategyNotSupportedError(self.named_locks_unsupported_reason())

    def unlock(self, name: str) -> ColumnElement:
        raise StrategyNotSupportedError(self.named_locks_unsupported_reason())

    #: Whether a WITH clause may hold an UPDATE … RETURNING (PostgreSQL): a lock-based claim
    #: then lists, locks and marks its jobs in one statement.
    writes_in_with = False

    def try_lock_named_by(self, prefix: str) -> Callable[[ColumnElement], ColumnElement] | None:
        """key → ``try_lock(prefix + str(key))``, for a key read in the same statement (a job's
        id); None where that name cannot be built in SQL: the caller then reads the keys first
        and locks them in a second statement."""
        return None

    def one_statement_transaction(self, conn: Connection) -> contextlib.AbstractContextManager[Any]:
        """A transaction for work whose statements may each commit on their own (a lock-based
        claim's one statement): where the driver can, each commits as it runs, sparing the
        BEGIN and COMMIT round trips; elsewhere a plain transaction."""
        return conn.begin()

    def statements_alone(self, conn: Connection) -> contextlib.AbstractContextManager[Any]:
        """Around the last statements of ``conn``'s open transaction (a lock-based batch's
        outcome, fenced UPDATE and lock release): where the transaction has sent nothing yet
        (no handler wrote) and the driver begins one only with its first statement, each runs
        committed on its own, sparing the BEGIN and COMMIT round trips; elsewhere as they are.
        Only for statements each safe to commit alone, in their order."""
        return contextlib.nullcontext()

    def statements_together(self, conn: Connection) -> contextlib.AbstractContextManager[Any]:
        """Around statements that must commit together (a key's row lock held from the read
        that takes it to the write that depends on it), even inside ``one_statement_transaction``
        or ``statements_alone``: where those made each statement commit on its own, the block
        is one transaction of its own, committed at its end (rolled back by an error); else
        it is part of ``conn``'s transaction as it is."""
        return contextlib.nullcontext()

    def unlock_named_by(self, prefix: str) -> sa.Select | None:
        """A statement releasing the locks ``try_lock_named_by(prefix)`` takes, one for each
        key of its array parameter ``keys``; None where there is none (``unlock`` each)."""
        return None

    def commit_unflushed(self) -> ColumnElement | None:
        """An expression that, read in a transaction, lets its COMMIT return before the log
        reaches the disk; None where no setting does that for one transaction. Only for a
        transaction whose loss in a crash loses nothing: a lock-based claim's ``running`` mark
        (lost, the job is simply available again), which the outcome's own durable commit,
        later in the same log, makes durable anyway."""
        return None

    # ---- ending another thread's connection (a handler stuck past its timeout) --------------
    def end_connection(self, engine: Engine, dbapi_connection: Any) -> bool:
        """End a connection another thread holds, from outside: its transaction rolls back and
        every lock it holds is released. False when this database offers no way to."""
        return False

    # ---- where cancel requests for running jobs go ------------------------------------------
    @classmethod
    def side_database_url(cls, url: sa.engine.URL) -> sa.engine.URL | None:
        """A database of its own for cancel requests, or None: they go in the queue's database.

        A request must never wait for a lock that the running job holds. Row-locking databases
        keep requests in a table of their own next to the jobs (the job's row may be locked,
        that table's rows are not); a database with one write lock (SQLite), which the running
        batch holds until it ends, needs them in another database.
        """
        return None

    # ---- push wake-ups -------------------------------------------------------------------------
    def notifier(self, engine: Engine, channel: str) -> Notifier:
        """How this database tells idle workers that jobs arrived (default: it cannot)."""
        return PollingOnly()

    def announcement(self) -> sa.Executable | None:
        """A statement sending the text bound as ``message`` on the channel bound as
        ``channel`` when its transaction commits, where the database can push (default: it
        cannot, None; listeners poll)."""
        return None

    def finish_listener(
        self, engine: Engine, channel: str, on_finished: Callable[[list[int] | None], None]
    ) -> Notifier | None:
        """A listener (not started) that calls ``on_finished(job_ids)`` for each announcement
        that awaited jobs finished, and ``on_finished(None)`` whenever announcements may have
        been missed (it (re)connected; SQLite's commit watch: any commit); None where the
        database cannot push (``finishes_pushed``)."""
        return None

    def json_value(self, value: ColumnElement) -> ColumnElement:
        """A bound JSON text as a value a JSON column accepts inside an expression (a CASE)."""
        return value

    @abc.abstractmethod
    def json_list_append(
        self, column: ColumnElement, entry: ColumnElement, keep: int
    ) -> ColumnElement:
        """``column``'s JSON list (NULL: an empty one) with ``entry`` — the JSON text of an
        object — appended, stamped ``"at"`` with ``now()`` as ISO-8601 UTC text ending in Z;
        when the list already holds ``keep`` (at least 2) entries, its oldest is dropped. A
        job's errors are kept with it."""

    # ---- column types -------------------------------------------------------------------------
    @classmethod
    def json_type(cls) -> sa.types.TypeEngine | None:
        """Column type holding payload JSON; None keeps the portable text column."""
        return None

    @classmethod
    def timestamp_type(cls) -> sa.types.TypeEngine | None:
        return None

    @classmethod
    def database_types(cls) -> sqltypes.DatabaseTypes:
        """What the queue tables need of this database (``dbqueue.schema.types``)."""
        return sqltypes.DatabaseTypes(
            payload=cls.json_type(),
            timestamp=cls.timestamp_type(),
            server_now=cls.server_now_default(),
        )

    @classmethod
    def server_now_default(cls) -> Any:
        """DDL default for timestamp columns, so plain SQL INSERTs get the same clock."""
        return sa.func.current_timestamp()

    # ---- engines ------------------------------------------------------------------------------
    @classmethod
    def engine_kwargs(cls) -> dict[str, Any]:
        """Keyword arguments for engines dbqueue creates itself from a URL."""
        return {"pool_pre_ping": True}

    @classmethod
    def configure_engine(cls, engine: Engine) -> None:
        """Install event hooks on an engine dbqueue created (e.g. SQLite's BEGIN IMMEDIATE)."""

    @classmethod
    def check_url(cls, url: sa.engine.URL) -> None:
        """Refuse, with the fix, a URL no queue can run on (before dbqueue makes an engine)."""

    @classmethod
    def normalize_url(cls, url: sa.engine.URL) -> sa.engine.URL:
        """The URL as SQLAlchemy must get it: common spellings made ones it loads, with the
        driver dbqueue installs where the URL names none (engines and offline migrations)."""
        return url

    @classmethod
    def sync_url(cls, url: sa.engine.URL) -> sa.engine.URL | None:
        """``url`` with the sync counterpart of the asyncio driver it names; None when this
        module knows none for it."""
        backend, _, driver = url.drivername.partition("+")
        sync = cls.sync_drivers.get(driver)
        return None if sync is None else url.set(drivername=f"{backend}+{sync}")

    @classmethod
    def async_url(cls, url: sa.engine.URL) -> sa.engine.URL | None:
        """The URL with this database's asyncio driver in place of the one it names; None where
        the database has no async path."""
        if cls.async_driver is None:
            return None
        backend = cls.normalize_url(url).drivername.partition("+")[0]
        return url.set(drivername=f"{backend}+{cls.async_driver}")

    def check_connection(self, conn: Connection) -> None:
        """Refuse, with the fix, a connection configured in a way dbqueue cannot work with."""

    # ---- DDL ----------------------------------------------------------------------------------
    def table_options(self, conn: Connection | None, key: str) -> dict[str, Any]:
        """Keyword arguments for CREATE TABLE of a queue table whose primary key is ``key``
        (``conn`` is None when a migration only prints its SQL)."""
        return {}

    # ---- errors -------------------------------------------------------------------------------
    def is_missing_table(self, exc: BaseException) -> bool:
        return False

    def is_transient(self, exc: BaseException) -> bool:
        """Deadlocks, lock wait timeouts, serialisation failures: retry the whole transaction."""
        return False

    def connection_lost(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by the driver outside SQLAlchemy's DBAPI errors, means the
        server closed the connection (a restart), not a bug: the worker reconnects quietly."""
        return False


def with_driver(url: sa.engine.URL, backend: str, driver: str) -> sa.engine.URL:
    """``url`` as ``backend+driver://…``, keeping the driver it names, if any."""
    named = url.drivername.partition("+")[2]
    return url.set(drivername=f"{backend}+{named or driver}")


def seconds_expression(seconds: float | ColumnElement) -> ColumnElement:
    """A number of seconds as a typed SQL value."""
    if isinstance(seconds, ColumnElement):
        return sa.cast(seconds, sa.Float())
    return sa.literal(float(seconds), sa.Float())


def driver_code(exc: BaseException) -> Any:
    """The driver's error code (first argument of PyMySQL errors, pgcode for psycopg2)."""
    orig = getattr(exc, "orig", exc)
    code = getattr(orig, "pgcode", None)
    if code is None and getattr(orig, "args", None):
        code = orig.args[0]
    return code

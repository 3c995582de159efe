"""The queue tables, defined once as SQLAlchemy Core ``Table`` objects.

Migrations (``dbqueue/migrations``) create exactly these tables; a test diffs the two. Names come
from a prefix (default ``dbqueue_``) or explicit names, and an optional schema, so one database
can hold several independent queues.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles

from dbqueue.base.identifiers import MAX_SUBSCRIPTION_ID, check_identifier, check_prefix
from dbqueue.job import Status
from dbqueue.schema.types import Payload, UtcDateTime, for_dialect

DEFAULT_PREFIX = "dbqueue_"
DEFAULT_QUEUE = "default"
DEFAULT_PRIORITY = 50
#: The max_attempts column's server default (the seed's QUEUE_MAX_RETRY): what a plain SQL
#: INSERT naming no max_attempts gets. The App writes its own default on every job it enqueues.
DEFAULT_MAX_ATTEMPTS = 100
MAX_MESSAGE_CHARS = 10_000
MAX_UNIQUE_KEY = 255
MAX_KEY_CHARS = 255  # a job's key (enqueue(..., key=...))
MAX_TRACEPARENT = 128  # a W3C traceparent is 55 characters
HTTP_METHODS = ("GET", "POST", "PUT")  # what a webhook subscription may use (the seed's)
DEFAULT_HTTP_METHOD = "POST"


@dataclass(frozen=True)
class TableNames:
    jobs: str
    subscriptions: str
    schema: str | None = None

    def __post_init__(self) -> None:
        # However a TableNames is built, its names are safe to put into DDL.
        check_identifier(self.jobs, "jobs table name")
        check_identifier(self.subscriptions, "subscriptions table name")
        if self.schema is not None:
            check_identifier(self.schema, "schema name")
        check_identifier(
            self.version_table, "migration version table name (jobs table + '_alembic')"
        )

    @classmethod
    def resolve(
        cls,
        prefix: str | None = None,
        schema: str | None = None,
        jobs_table: str | None = None,
        subscriptions_table: str | None = None,
    ) -> TableNames:
        prefix = check_prefix(DEFAULT_PREFIX if prefix is None else prefix)
        names = cls(
            jobs=check_identifier(jobs_table or f"{prefix}jobs", "jobs table name"),
            subscriptions=check_identifier(
                subscriptions_table or f"{prefix}subscriptions", "subscriptions table name"
            ),
            schema=check_identifier(schema, "schema name") if schema else None,
        )
        check_identifier(
            names.version_table, "migration version table name (jobs table + '_alembic')"
        )
        return names

    @property
    def version_table(self) -> str:
        """Alembic's version table for this queue, so several queues migrate independently."""
        return f"{self.jobs}_alembic"

    @property
    def maintenance(self) -> str:
        """One row per maintenance routine: which tick last ran, by whom, with what result."""
        return f"{self.jobs}_maintenance"

    @property
    def periodic(self) -> str:
        """One row per (schedule, tick) enqueued: its primary key makes a tick enqueue once."""
        return f"{self.jobs}_periodic"

    @property
    def slots(self) -> str:
        """Queue-limit slots: one row per (queue, slot number) a running job may hold."""
        return f"{self.jobs}_slots"

    @property
    def cancels(self) -> str:
        """Cancel requests for running jobs, kept off the job's row (which a running batch may
        hold locked): one row per request, deleted when the job ends."""
        return f"{self.jobs}_cancels"

    @property
    def unique(self) -> str:
        """Unique keys: one row per (queue, unique_key) an unfinished job holds."""
        return f"{self.jobs}_unique"

    @property
    def keys(self) -> str:
        """Busy keys: a row per (queue, key) that has unfinished jobs (see engine/keys.py)."""
        return f"{self.jobs}_keys"

    @property
    def workers(self) -> str:
        """The registry of live workers: one row per worker process, heartbeated."""
        return f"{self.jobs}_workers"

    @property
    def all(self) -> tuple[str, ...]:
        """Every queue table's name (not Alembic's version table)."""
        return (
            self.jobs,
            self.maintenance,
            self.subscriptions,
            self.periodic,
            self.slots,
            self.cancels,
            self.unique,
            self.keys,
            self.workers,
        )

    @property
    def qualified_jobs(self) -> str:
        """The jobs table's name with its schema: the namespace of locks and notifications."""
        return f"{self.schema}.{self.jobs}" if self.schema else self.jobs


MAINTENANCE_ROUTINES = ("purge", "rescue", "renotify")


@dataclass(frozen=True)
class QueueTables:
    names: TableNames
    metadata: sa.MetaData
    jobs: sa.Table
    maintenance: sa.Table
    subscriptions: sa.Table
    periodic: sa.Table
    slots: sa.Table
    cancels: sa.Table
    unique: sa.Table
    keys: sa.Table
    workers: sa.Table


def _timestamp(name: str, *, server_now: bool = False, nullable: bool = True) -> sa.Column:
    # Each database spells "current UTC time" differently in DDL; NowDefault picks it.
    default = sa.schema.DefaultClause(NowDefault()) if server_now else None
    return sa.Column(name, UtcDateTime(), nullable=nullable, server_default=default)


class NowDefault(sa.sql.expression.ColumnElement):
    """Server default rendering each database's UTC clock (registered by its dialect module)."""

    inherit_cache = True


@compiles(NowDefault)
def _compile_now_default(element: NowDefault, compiler: sa.sql.compiler.SQLCompiler, **kw) -> str:
    return compiler.process(for_dialect(compiler.dialect).server_now, **kw)


#: The marker in each queue table's ``info`` (which of dbqueue's tables it is), by which
#: ``dbqueue.alembic.include_object`` tells them apart in an application's own MetaData.
TABLE_INFO_KEY = "dbqueue"


def _table_kwargs(kind: str) -> dict:
    return {
        "mysql_engine": "InnoDB",
        "mysql_charset": "utf8mb4",
        "mysql_collate": "utf8mb4_bin",
        "info": {TABLE_INFO_KEY: kind},
    }


def jobs_table(metadata: sa.MetaData, names: TableNames) -> sa.Table:
    table = sa.Table(
        names.jobs, metadata, *_jobs_columns(), schema=names.schema, **_table_kwargs("jobs")
    )
    _jobs_indexes(table, names.jobs)
    return table


def _jobs_columns() -> list[sa.Column]:
    """The jobs table's columns, in their order."""
    id_type = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite: rowid alias
    return [
        sa.Column("id", id_type, primary_key=True, autoincrement=True),
        sa.Column("queue", sa.String(64), nullable=False, server_default=DEFAULT_QUEUE),
        sa.Column("task", sa.String(200), nullable=False),
        sa.Column("payload", Payload(), nullable=True),
        sa.Column("payload_hash", sa.String(64), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False, server_default=str(DEFAULT_PRIORITY)),
        sa.Column("status", sa.String(16), nullable=False, server_default=Status.AVAILABLE),
        _timestamp("run_at", server_now=True, nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"),
        sa.Column(
            "max_attempts", sa.Integer(), nullable=False, server_default=str(DEFAULT_MAX_ATTEMPTS)
        ),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("worker_id", sa.String(255), nullable=True),
        sa.Column("origin", sa.String(255), nullable=True),
        sa.Column("destination", sa.String(255), nullable=True),
        sa.Column("external_key", sa.String(255), nullable=True),
        sa.Column("tenant", sa.BigInteger(), nullable=True),
        sa.Column("business_group", sa.String(100), nullable=True),
        sa.Column("publication_id", sa.BigInteger(), nullable=True),
        sa.Column("subscription_id", sa.String(100), nullable=True),
        sa.Column("dead", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("live_id", sa.BigInteger(), nullable=True),
        _timestamp("first_attempt_at"),
        _timestamp("previous_attempt_at"),
        sa.Column("previous_status", sa.String(16), nullable=True),
        sa.Column("previous_message", sa.Text(), nullable=True),
        _timestamp("created_at", server_now=True, nullable=False),
        _timestamp("started_at"),
        _timestamp("finished_at"),
        _timestamp("updated_at", server_now=True, nullable=False),
        sa.Column("result", Payload(), nullable=True),  # the handler's return value, as JSON
        sa.Column("awaited", sa.Boolean(), nullable=True),  # a caller waits (app.call)
        _timestamp("cancel_requested_at"),  # a cancel asked of a running job
        sa.Column(
            "key", sa.String(MAX_KEY_CHARS), nullable=True
        ),  # jobs of a key run one at a time
        sa.Column("key_seq", sa.BigInteger(), nullable=True),  # its place in the key's line
        sa.Column("unique_key", sa.String(MAX_UNIQUE_KEY), nullable=True),  # see unique_table
        sa.Column("scored_payloads", Payload(), nullable=True),  # a coalescing task's payloads
        # The enqueuer's W3C trace context (dbqueue.tracing): links the job's span to it.
        sa.Column("traceparent", sa.String(MAX_TRACEPARENT), nullable=True),
        # A job run outside its claim's transaction is its worker's until then (heartbeated).
        _timestamp("lease_until"),
        # Every failed attempt's error: [{"at", "attempt", "message", "traceback"}, ...].
        sa.Column("errors", Payload(), nullable=True),
    ]


def _jobs_indexes(table: sa.Table, t: str) -> None:
    """The jobs table's indexes, each for the statement that reads through it."""
    # The claim reads one contiguous range: status = 'available' AND queue = ?, in claim order.
    # With this exact column order MySQL's locking read stops at the LIMIT instead of locking
    # every row it scans.
    sa.Index(
        f"{t}_claim", table.c.status, table.c.queue, table.c.priority, table.c.run_at, table.c.id
    )
    # Purge, in chunks, oldest first. Partial where the database can: enqueues skip it.
    finished = table.c.finished_at.isnot(None)
    sa.Index(f"{t}_finished", table.c.finished_at, postgresql_where=finished, sqlite_where=finished)
    sa.Index(f"{t}_equivalent", table.c.task, table.c.payload_hash)  # find_equivalent
    # The next job of a key: (key, queue, status = 'blocked') in line order. Partial where the
    # database can: unkeyed jobs write no entry.
    keyed = table.c["key"].isnot(None)
    sa.Index(
        f"{t}_key",
        table.c["key"],
        table.c.queue,
        table.c.status,
        table.c.key_seq,
        postgresql_where=keyed,
        sqlite_where=keyed,
    )


def maintenance_table(metadata: sa.MetaData, names: TableNames) -> sa.Table:
    return sa.Table(
        names.maintenance,
        metadata,
        sa.Column("routine", sa.String(32), primary_key=True),
        _timestamp("last_tick"),
        _timestamp("started_at"),
        _timestamp("finished_at"),
        sa.Column("worker_id", sa.String(255), nullable=True),
        sa.Column("runs", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("result", sa.Text(), nullable=True),
        schema=names.schema,
        **_table_kwargs("maintenance"),
    )


def subscriptions_table(metadata: sa.MetaData, names: TableNames) -> sa.Table:
    """Who receives each pub/sub topic: code registered for the id, or a webhook (``url``).

    Only a string primary key and a plain index: no foreign keys, unique keys or triggers, so the
    same table works on SingleStore (whose unique keys must contain the shard key).
    """
    t = names.subscriptions
    table = sa.Table(
        t,
        metadata,
        sa.Column("id", sa.String(MAX_SUBSCRIPTION_ID), primary_key=True, autoincrement=False),
        sa.Column("topic", sa.String(200), nullable=False),
        sa.Column("tenant", sa.BigInteger(), nullable=True),
        sa.Column("business_group", sa.String(100), nullable=True),
        sa.Column("url", sa.Text(), nullable=True),
        sa.Column("http_method", sa.String(8), nullable=True, server_default=DEFAULT_HTTP_METHOD),
        sa.Column("headers", Payload(), nullable=True),
        sa.Column("active", sa.Boolean(), nullable=False, server_default=sa.true()),
        _timestamp("created_at", server_now=True, nullable=False),
        schema=names.schema,
        **_table_kwargs("subscriptions"),
    )
    sa.Index(f"{t}_topic", table.c.topic)  # publish: the active subscriptions of one topic
    return table


def periodic_table(metadata: sa.MetaData, names: TableNames) -> sa.Table:
    """The ticks of periodic schedules that were enqueued. Inserted in the transaction that
    enqueues the tick's job: a second worker meeting the same tick hits the primary key and
    rolls back, so each tick makes exactly one job, with no lock and on every database."""
    return sa.Table(
        names.periodic,
        metadata,
        sa.Column("name", sa.String(200), nullable=False),
        _timestamp("tick", nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        _timestamp("created_at", server_now=True, nullable=False),
        sa.PrimaryKeyConstraint("name", "tick"),
        schema=names.schema,
        **_table_kwargs("periodic"),
    )


def slots_table(metadata: sa.MetaData, names: TableNames) -> sa.Table:
    """Queue limits: a job of a limited queue runs while holding one of its queue's slots."""
    return sa.Table(
        names.slots,
        metadata,
        sa.Column("queue", sa.String(64), primary_key=True, autoincrement=False),
        sa.Column("slot", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("worker_id", sa.String(255), nullable=True),
        _timestamp("taken_at"),
        schema=names.schema,
        **_table_kwargs("slots"),
    )


def cancels_table(metadata: sa.MetaData, names: TableNames) -> sa.Table:
    """Cancel requests for running jobs (``app.cancel``): the job's own row may be locked by the
    batch running it, so a request is a row here, which the worker running the job polls.
    Several requests for one job are harmless (hence a surrogate key, no unique one)."""
    t = names.cancels
    table = sa.Table(
        t,
        metadata,
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        _timestamp("requested_at", server_now=True, nullable=False),
        schema=names.schema,
        **_table_kwargs("cancels"),
    )
    sa.Index(f"{t}_job", table.c.job_id)
    return table


def unique_table(metadata: sa.MetaData, names: TableNames) -> sa.Table:
    """Unique keys (``enqueue(..., unique_key=…)``): the row of (queue, unique_key) names the
    unfinished job that holds the key. Written in the enqueue's transaction, so the primary key
    makes concurrent enqueues of one key wait for each other and a rolled-back enqueue holds
    nothing; deleted (or handed to ``rerun_id``) in the transaction that finishes the holder.
    A primary key and nothing else: SingleStore shards it on ``unique_key``."""
    return sa.Table(
        names.unique,
        metadata,
        sa.Column("queue", sa.String(64), primary_key=True, autoincrement=False),
        sa.Column("unique_key", sa.String(MAX_UNIQUE_KEY), primary_key=True, autoincrement=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        # The follow-up of on_conflict="rerun" while the holder runs, and when it is due.
        sa.Column("rerun_id", sa.BigInteger(), nullable=True),
        _timestamp("rerun_at"),
        sa.Column("conflicts", sa.Integer(), nullable=False, server_default="0"),
        _timestamp("created_at", server_now=True, nullable=False),
        schema=names.schema,
        **_table_kwargs("unique"),
    )


def keys_table(metadata: sa.MetaData, names: TableNames) -> sa.Table:
    """Busy keys: a row exists while a (queue, key) has unfinished keyed jobs; ``last_seq`` is the
    place given to the latest of them. Written in the enqueue's transaction (its row lock
    orders concurrent enqueues of a key) and deleted by the completion of the key's last job."""
    return sa.Table(
        names.keys,
        metadata,
        sa.Column("queue", sa.String(64), primary_key=True, autoincrement=False),
        sa.Column("key", sa.String(MAX_KEY_CHARS), primary_key=True, autoincrement=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        _timestamp("created_at", server_now=True, nullable=False),
        schema=names.schema,
        **_table_kwargs("keys"),
    )


def workers_table(metadata: sa.MetaData, names: TableNames) -> sa.Table:
    """The registry of worker processes: each inserts its row at start, heartbeats it every few
    seconds from a thread of its own (what it runs now, its counters) and deletes it at exit.
    A row whose ``expires_at`` has passed is a worker gone without a word; maintenance deletes
    it. A string key and nothing else, so it suits SingleStore too."""
    return sa.Table(
        names.workers,
        metadata,
        sa.Column("id", sa.String(64), primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", Payload(), nullable=True),  # JSON list of queue names
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("strategy", sa.String(32), nullable=False),
        _timestamp("started_at", server_now=True, nullable=False),
        _timestamp("heartbeat_at", server_now=True, nullable=False),
        _timestamp("expires_at", nullable=False),
        sa.Column("running", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("jobs", Payload(), nullable=True),  # JSON list: {id, queue, task, since}
        sa.Column("processed", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("failed", sa.BigInteger(), nullable=False, server_default="0"),
        schema=names.schema,
        **_table_kwargs("workers"),
    )


@functools.lru_cache(maxsize=64)
def tables_for(names: TableNames) -> QueueTables:
    metadata = sa.MetaData()
    return QueueTables(
        names=names,
        metadata=metadata,
        jobs=jobs_table(metadata, names),
        maintenance=maintenance_table(metadata, names),
        subscriptions=subscriptions_table(metadata, names),
        periodic=periodic_table(metadata, names),
        slots=slots_table(metadata, names),
        cancels=cancels_table(metadata, names),
        unique=unique_table(metadata, names),
        keys=keys_table(metadata, names),
        workers=workers_table(metadata, names),
    )

"""Test databases and the tables test handlers write to.

"singlestore" is the SingleStore path — the singlestoredb driver and dialect, and dbqueue's
SingleStore module — run against MariaDB (no SingleStore server exists here): same server as
"mysql", so its queue tables get a prefix of their own.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import dbqueue
from dbqueue import dialects, strategies
from dbqueue.dialects.sqlite import LenientDateTime
from dbqueue.migrations import migrate
from dbqueue.schema.types import NativeJson

# Every suite, and every pytest-xdist worker of one, has tables of its own (processes the tests
# start inherit both variables). Override to run two suites at once against the same servers.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
PREFIX = os.environ.get("DBQUEUE_TEST_PREFIX", "dbqt_") + (
    f"{_XDIST_WORKER}_" if _XDIST_WORKER else ""
)
POSTGRESQL_URL = os.environ.get(
    "DBQUEUE_TEST_POSTGRESQL_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("DBQUEUE_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
SINGLESTORE_URL = os.environ.get(
    "DBQUEUE_TEST_SINGLESTORE_URL", "singlestoredb://root@127.0.0.1:3306/test"
)

# Handlers write here, keyed by job id, in the job's own transaction: a duplicate key means a job
# ran twice, a missing row means a job's writes were lost.
effects_metadata = sa.MetaData()
effects = sa.Table(
    f"{PREFIX}effects",
    effects_metadata,
    sa.Column("job_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("note", sa.String(200)),
    sa.Column("pid", sa.Integer),
    mysql_engine="InnoDB",
)


def effect_rows(backend: Backend, *columns: str) -> list[tuple[Any, ...]]:
    """The handlers' rows, sorted: (job_id, note, pid) unless other ``columns`` are named."""
    engine = backend.engine()
    try:
        with engine.connect() as conn:
            chosen = [effects.c[name] for name in columns or ("job_id", "note", "pid")]
            return sorted(tuple(row) for row in conn.execute(sa.select(*chosen)))
    finally:
        engine.dispose()


class Capabilities:
    """What a backend's database and claim strategy can do, asked of dbqueue's own classes (the
    Dialect its URL selects, the strategy ``strategies.resolve`` picks for it): tests branch on
    these, never on a database's or a strategy's name."""

    database: str
    strategy: str

    @property
    def dialect_class(self) -> type[dialects.Dialect]:
        """The Dialect class dbqueue selects for this database's URL."""
        return dialects.class_for_url(sa.engine.make_url(url_of(self.database, Path("x.db"))))

    @property
    def strategy_class(self) -> type[strategies.ClaimStrategy]:
        """The strategy class that claims for this pair (``for_dialect`` applied)."""
        return strategies.resolve(self.strategy, self.dialect_class)

    @property
    def commits_claims(self) -> bool:
        """The claim commits ``running`` before the handlers run (a lock-based claim: the job
        then waits for rescue when its worker dies)."""
        return not self.strategy_class.claims_in_transaction

    @property
    def claims_through_lock_server(self) -> bool:
        """Claims go through ``dbqueue server``, which also pushes wake-ups and finishes."""
        return self.strategy_class.claims_through_lock_server

    @property
    def claims_under_database_locks(self) -> bool:
        """A committed claim held by the database's own named locks, named in its SQL."""
        return self.commits_claims and not self.claims_through_lock_server

    @property
    def knows_live_workers(self) -> bool:
        """A ``running`` job's worker can be told alive or dead (locks rescue can test)."""
        overridden = (
            self.strategy_class.liveness_locks is not strategies.ClaimStrategy.liveness_locks
        )
        return overridden or self.dialect_class.supports_named_locks

    @property
    def single_writer(self) -> bool:
        """The database admits one writer at a time: a batch holds its one write lock."""
        return self.dialect_class.single_writer

    @property
    def reuses_rolled_back_ids(self) -> bool:
        """A new id is the largest + 1 (one writer at a time): a rolled-back id comes again."""
        return self.dialect_class.single_writer

    @property
    def has_server(self) -> bool:
        """The database is a server (host, port, credentials), not a file."""
        return self.dialect_class.default_port is not None

    @property
    def has_async_driver(self) -> bool:
        """The database has an asyncio driver (async handlers and async enqueue)."""
        return self.dialect_class.async_driver is not None

    @property
    def typed_columns(self) -> bool:
        """A column refuses text of another type (SQLite stores any text in any column; its
        timestamps are then read leniently)."""
        return not isinstance(self.dialect_class.timestamp_type(), LenientDateTime)

    @property
    def checks_json(self) -> bool:
        """The payload column is the database's JSON type, which refuses invalid JSON."""
        return isinstance(self.dialect_class.json_type(), NativeJson)

    @property
    def inserts_notify(self) -> bool:
        """The database's inserts NOTIFY listening workers (LISTEN/NOTIFY)."""
        return self.dialect_class.supports_listen_notify

    @property
    def inserts_wake_workers(self) -> bool:
        """An insert from any connection wakes idle workers (NOTIFY, a commit watch)."""
        return self.dialect_class.notifier is not dialects.Dialect.notifier

    @property
    def one_statement_commits_alone(self) -> bool:
        """``one_statement_transaction`` lets its statement commit alone (driver autocommit)."""
        return _overrides(self.dialect_class, "one_statement_transaction")

    @property
    def statements_commit_alone(self) -> bool:
        """``statements_alone`` lets each statement commit alone (driver autocommit)."""
        return _overrides(self.dialect_class, "statements_alone")

    @property
    def ids_follow_session_increment(self) -> bool:
        """A multi-row INSERT's ids are consecutive only as the session's auto-increment
        settings allow: ``consecutive_ids`` asks them (a server numbering concurrent writers)."""
        return _overrides(self.dialect_class, "consecutive_ids") and not self.single_writer

    @property
    def paired_strategies(self) -> set[str]:
        """The strategies BACKENDS runs on this database: every one it supports."""
        return {spec.strategy for spec in BACKENDS.values() if spec.database == self.database}

    def lock_wait_limit(self, seconds: int) -> str:
        """SQL making this session's waits for a lock fail after ``seconds``."""
        return LOCK_WAIT_LIMIT[self.database].format(seconds=seconds, milliseconds=seconds * 1000)


def _overrides(dialect_class: type[dialects.Dialect], method: str) -> bool:
    return getattr(dialect_class, method) is not getattr(dialects.Dialect, method)


@dataclass(frozen=True)
class BackendSpec(Capabilities):
    key: str
    database: str
    strategy: str

    def url(self, sqlite_path: Path) -> str:
        return url_of(self.database, sqlite_path)

    @property
    def prefix(self) -> str:
        return prefix_for(self.database)

    @property
    def is_default(self) -> bool:
        """The pair stands for its database alone (the database's default strategy)."""
        return DEFAULT_STRATEGY[self.database] == self.strategy


def url_of(database: str, sqlite_path: Path) -> str:
    """The test server's URL for ``database`` (a file under ``sqlite_path`` for SQLite)."""
    if database == "postgresql":
        return POSTGRESQL_URL
    if database == "mysql":
        return MYSQL_URL
    if database == "singlestore":
        return SINGLESTORE_URL
    return f"sqlite:///{sqlite_path}"


def prefix_for(database: str) -> str:
    """The SingleStore path shares MariaDB's database: its tables get a prefix of their own."""
    return f"{PREFIX}ss_" if database == "singlestore" else PREFIX


BACKENDS: dict[str, BackendSpec] = {
    spec.key: spec
    for spec in (
        BackendSpec("postgresql-skip_locked", "postgresql", "skip_locked"),
        BackendSpec("mysql-skip_locked", "mysql", "skip_locked"),
        BackendSpec("postgresql-advisory_lock", "postgresql", "advisory_lock"),
        BackendSpec("mysql-advisory_lock", "mysql", "advisory_lock"),
        BackendSpec("sqlite-sqlite", "sqlite", "sqlite"),
        BackendSpec("postgresql-lock_server", "postgresql", "lock_server"),
        BackendSpec("mysql-lock_server", "mysql", "lock_server"),
        BackendSpec("sqlite-lock_server", "sqlite", "lock_server"),
        BackendSpec("singlestore-lock_server", "singlestore", "lock_server"),
    )
}
#: Each database's default strategy: the backend that stands for the database alone.
DEFAULT_STRATEGY = {
    "postgresql": "skip_locked",
    "mysql": "skip_locked",
    "sqlite": "sqlite",
    "singlestore": "lock_server",
}
#: SQL limiting a session's wait for a lock (a row's, or the database's one write lock).
LOCK_WAIT_LIMIT = {
    "postgresql": "SET lock_timeout = '{seconds}s'",
    "mysql": "SET SESSION innodb_lock_wait_timeout = {seconds}",
    # (the SingleStore path runs on MariaDB)
    "singlestore": "SET SESSION innodb_lock_wait_timeout = {seconds}",
    "sqlite": "PRAGMA busy_timeout = {milliseconds}",
}


def backend_keys(wanted: Callable[[BackendSpec], bool] = lambda spec: True) -> list[str]:
    """The keys of every pair with the capabilities ``wanted`` asks for, sorted."""
    return sorted(key for key, spec in BACKENDS.items() if wanted(spec))


def database_keys(wanted: Callable[[BackendSpec], bool] = lambda spec: True) -> list[str]:
    """``backend_keys``, one per database: its default pair."""
    return backend_keys(lambda spec: spec.is_default and wanted(spec))


CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def requires_backend(name: str, url: str) -> None:
    """Fail under CI, skip loudly otherwise, when a database server is unreachable."""
    problem = database_reachable(url)
    if problem is None:
        return
    import pytest  # here: the worker processes tests start import this module, not pytest

    message = f"{name} is unreachable at {sa.engine.make_url(url).render_as_string()}: {problem}"
    if CI:
        pytest.fail(f"CI=true and {message}", pytrace=False)
    sys.stderr.write(f"\n{'!' * 78}\n!! SKIPPING {name} TESTS: {message}\n{'!' * 78}\n")
    pytest.skip(message)


def database_reachable(url: str) -> str | None:
    """None if the database answers, else why not."""
    engine = sa.create_engine(url, connect_args=_connect_timeout(url))
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        return None
    except Exception as exc:  # any failure means "not usable"
        return str(getattr(exc, "orig", exc)).strip().splitlines()[0]
    finally:
        engine.dispose()


def _connect_timeout(url: str) -> dict[str, Any]:
    backend = sa.engine.make_url(url).get_backend_name()
    if backend in ("postgresql", "mysql", "mariadb", "singlestoredb"):
        return {"connect_timeout": 5}
    return {}


def drop_queue_tables(engine: sa.Engine, prefix: str = PREFIX) -> None:
    """Remove every object the migrations create, whatever state an earlier run left."""
    names = dbqueue.App(engine, table_prefix=prefix).names
    with engine.begin() as conn:
        for table in (*names.all, names.version_table):
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        if engine.dialect.name == "postgresql":
            conn.execute(sa.text(f"DROP FUNCTION IF EXISTS {names.jobs}_notify()"))


def prepare_database(url: str, prefix: str = PREFIX) -> None:
    """Fresh queue tables (through the real migrations) and the effects table."""
    app = dbqueue.App(url, table_prefix=prefix)
    engine = app.create_engine()
    try:
        drop_queue_tables(engine, prefix)
        migrate.upgrade(engine, app.names)
        effects_metadata.drop_all(engine)
        effects_metadata.create_all(engine)
    finally:
        engine.dispose()


@dataclass
class Backend(Capabilities):
    key: str
    database: str
    strategy: str
    url: str
    prefix: str = PREFIX
    #: HOST:PORT of the session's `dbqueue server` on this database (lock_server backends).
    server: str | None = None
    #: The App's execution mode: None (in the claim's transaction, the default) or False (jobs
    #: run outside it, under a lease): a module with ``BOTH_MODES = True`` runs in both.
    transaction: bool | None = None

    def app(self, **options: Any) -> dbqueue.App:
        """An App on this backend's test tables; fast retries unless told otherwise."""
        options.setdefault("retry_base_interval", 0.05)
        if self.transaction is not None:
            options.setdefault("transaction", self.transaction)
        if self.server is not None:
            options.setdefault("lock_server", self.server)
        app = dbqueue.App(self.url, table_prefix=self.prefix, **options)
        return app

    def worker_args(self) -> list[str]:
        """Arguments that point tests/support/worker_process.py at this backend's tables."""
        args = ["--prefix", self.prefix]
        return args + ["--server", self.server] if self.server else args

    def env(self) -> dict[str, str]:
        """Environment for a `dbqueue` command on this backend (its lock server, its mode)."""
        env = {"DBQUEUE_LOCK_SERVER": self.server} if self.server else {}
        if self.transaction is not None:
            env["DBQUEUE_TRANSACTION"] = str(self.transaction).lower()
        return env

    def run_worker(self, app: dbqueue.App, **options: Any) -> dbqueue.WorkerSummary:
        """Run a worker with this backend's strategy until nothing is runnable."""
        options.setdefault("burst", True)
        options.setdefault("poll_interval", 0.02)
        options.setdefault("install_signal_handlers", False)
        return app.run_worker(strategy=self.strategy, **options)

    def drain(self, app: dbqueue.App, rounds: int = 60, **options: Any) -> None:
        """Run burst workers until no job waits (retries are scheduled a moment later)."""
        pending: list[dict[str, Any]] = []
        for _ in range(rounds):
            self.run_worker(app, **options)
            pending = [j for j in self.jobs() if j["status"] in ("available", "running", "blocked")]
            if not pending:
                return
            time.sleep(0.05)
        raise AssertionError(f"queue did not drain: {pending}")

    def deliveries(self, publication_id: int) -> dict[str, dict[str, Any]]:
        """The live (not dead-letter) jobs of one publication, by subscription id."""
        return {
            j["subscription_id"]: j
            for j in self.jobs()
            if j["publication_id"] == publication_id and not j["dead"]
        }

    def engine(self) -> sa.Engine:
        return self.app().create_engine()

    def impatient_engine(self, seconds: int) -> sa.Engine:
        """An engine whose connections give up waiting for a lock after ``seconds``."""
        engine = self.engine()
        limit = self.lock_wait_limit(seconds)

        @sa.event.listens_for(engine, "connect")
        def _limit(dbapi_connection: Any, record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute(limit)  # a session setting: no Core construct
            cursor.close()
            dbapi_connection.commit()

        return engine

    def status_seen_elsewhere(self, job_id: int) -> str:
        """The job's status as another connection sees it (what is committed): read in the
        middle of a worker's transaction, it tells which of its writes committed apart."""
        engine = self.engine()
        try:
            with engine.connect() as conn:
                jobs = self.app().tables.jobs
                found = conn.execute(sa.select(jobs.c.status).where(jobs.c.id == job_id))
                return str(found.scalar_one())
        finally:
            engine.dispose()

    def reset(self) -> None:
        """Empty the queue and effects tables between tests."""
        engine = self.engine()
        app = self.app()
        maintenance = app.tables.maintenance
        requests = app.context.cancel_requests()
        try:
            if requests.separate:  # SQLite's side file of cancel requests
                with requests.engine().begin() as conn:
                    conn.execute(requests.table.delete())
            side = app.context.workers_side_engine()
            if side is not None:  # SQLite's side file of the registry of live workers
                with side.begin() as conn:
                    conn.execute(app.tables.workers.delete())
                side.dispose()
            with engine.begin() as conn:
                conn.execute(sa.text(f"DELETE FROM {self.prefix}jobs"))
                conn.execute(sa.text(f"DELETE FROM {self.prefix}subscriptions"))
                conn.execute(app.tables.cancels.delete())
                conn.execute(app.tables.unique.delete())
                conn.execute(app.tables.keys.delete())
                conn.execute(app.tables.workers.delete())
                conn.execute(effects.delete())
                conn.execute(
                    maintenance.update().values(
                        last_tick=None,
                        started_at=None,
                        finished_at=None,
                        worker_id=None,
                        runs=0,
                        result=None,
                    )
                )
        finally:
            requests.close()
            engine.dispose()

    def effect_ids(self) -> list[int]:
        engine = self.engine()
        try:
            with engine.connect() as conn:
                return sorted(conn.execute(sa.select(effects.c.job_id)).scalars())
        finally:
            engine.dispose()

    def jobs(self) -> list[dict[str, Any]]:
        engine = self.engine()
        app = self.app()
        try:
            with engine.connect() as conn:
                rows = conn.execute(sa.select(app.tables.jobs).order_by(app.tables.jobs.c.id))
                return [dict(r._mapping) for r in rows]
        finally:
            engine.dispose()

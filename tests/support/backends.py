"""Test databases and the tables test handlers write to."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import dbqueue
from dbqueue import migrate

PREFIX = "dbqt_"
POSTGRESQL_URL = os.environ.get(
    "DBQUEUE_TEST_POSTGRESQL_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("DBQUEUE_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")

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


@dataclass(frozen=True)
class BackendSpec:
    key: str
    database: str
    strategy: str

    def url(self, sqlite_path: Path) -> str:
        if self.database == "postgresql":
            return POSTGRESQL_URL
        if self.database == "mysql":
            return MYSQL_URL
        return f"sqlite:///{sqlite_path}"


BACKENDS: dict[str, BackendSpec] = {
    spec.key: spec
    for spec in (
        BackendSpec("postgresql-skip_locked", "postgresql", "skip_locked"),
        BackendSpec("mysql-skip_locked", "mysql", "skip_locked"),
        BackendSpec("postgresql-advisory_lock", "postgresql", "advisory_lock"),
        BackendSpec("mysql-advisory_lock", "mysql", "advisory_lock"),
        BackendSpec("sqlite-sqlite", "sqlite", "sqlite"),
    )
}


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
    if backend == "postgresql":
        return {"connect_timeout": 5}
    if backend in ("mysql", "mariadb"):
        return {"connect_timeout": 5}
    return {}


def drop_queue_tables(engine: sa.Engine, prefix: str = PREFIX) -> None:
    """Remove every object the migrations create, whatever state an earlier run left."""
    names = dbqueue.App(engine, table_prefix=prefix).names
    with engine.begin() as conn:
        for table in (names.jobs, names.subscriptions, names.maintenance, names.version_table):
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        if engine.dialect.name == "postgresql":
            conn.execute(sa.text(f"DROP FUNCTION IF EXISTS {names.jobs}_notify()"))


def prepare_database(url: str) -> None:
    """Fresh queue tables (through the real migrations) and the effects table."""
    app = dbqueue.App(url, table_prefix=PREFIX)
    engine = app.create_engine()
    try:
        drop_queue_tables(engine)
        migrate.upgrade(engine, app.names)
        effects_metadata.drop_all(engine)
        effects_metadata.create_all(engine)
    finally:
        engine.dispose()


@dataclass
class Backend:
    key: str
    database: str
    strategy: str
    url: str

    def app(self, **options: Any) -> dbqueue.App:
        """An App on this backend's test tables; fast retries unless told otherwise."""
        options.setdefault("retry_base_interval", 0.05)
        app = dbqueue.App(self.url, table_prefix=PREFIX, **options)
        return app

    def run_worker(self, app: dbqueue.App, **options: Any) -> dbqueue.WorkerSummary:
        """Run a worker with this backend's strategy until nothing is runnable."""
        options.setdefault("burst", True)
        options.setdefault("poll_interval", 0.02)
        options.setdefault("install_signal_handlers", False)
        return app.run_worker(strategy=self.strategy, **options)

    def engine(self) -> sa.Engine:
        return self.app().create_engine()

    def reset(self) -> None:
        """Empty the queue and effects tables between tests."""
        engine = self.engine()
        maintenance = self.app().tables.maintenance
        try:
            with engine.begin() as conn:
                conn.execute(sa.text(f"DELETE FROM {PREFIX}jobs"))
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

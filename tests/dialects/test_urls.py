"""Database URLs as people copy them from elsewhere: the common spellings reach the database
through the drivers dbqueue installs, and a driver that is not installed gets one line naming
the one to use, never a password."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from support.backends import MYSQL_URL, POSTGRESQL_URL, PREFIX, drop_queue_tables, requires_backend

import dbqueue
from dbqueue.migrations import migrate

URL_PREFIX = f"{PREFIX}url_"
SERVERS = {"postgresql": POSTGRESQL_URL, "mysql": MYSQL_URL}


def spelled(url: str, scheme: str, password: str | None = None) -> str:
    """The test server's URL with another scheme (and password)."""
    parsed = sa.engine.make_url(url).set(drivername=scheme)
    if password is not None:
        parsed = parsed.set(password=password)
    return parsed.render_as_string(hide_password=False)


@pytest.fixture
def server_url(database: str) -> Iterator[str]:
    """The server's test URL, without this module's queue tables before and after the test."""
    url = SERVERS[database]
    requires_backend(database, url)
    engine = dbqueue.App(url).create_engine()
    drop_queue_tables(engine, URL_PREFIX)
    try:
        yield url
    finally:
        drop_queue_tables(engine, URL_PREFIX)
        engine.dispose()


@pytest.mark.parametrize(
    "database, scheme",
    [
        ("postgresql", "postgres"),  # Heroku's and libpq's spelling, which SQLAlchemy dropped
        ("postgresql", "postgresql"),  # SQLAlchemy 2.1 would pick psycopg (3)
        ("mysql", "mysql"),  # SQLAlchemy would pick mysqlclient (MySQLdb)
        ("mysql", "mariadb"),
        ("mysql", "mariadb+pymysql"),  # ran, but SQLAlchemy's mariadb dialect lost the collation
    ],
)
def test_a_common_spelling_enqueues_and_runs_a_job(
    database: str, scheme: str, server_url: str
) -> None:
    app = dbqueue.App(spelled(server_url, scheme), table_prefix=URL_PREFIX)
    done: list[int] = []

    @app.task("note")
    def note(job: dbqueue.Job, session: object) -> None:
        done.append(job.payload["n"])

    app.migrate()
    job_id = app.enqueue(None, "note", {"n": 7})
    summary = app.run_worker(burst=True, install_signal_handlers=False, poll_interval=0.02)
    assert (summary.succeeded, done) == (1, [7])
    with app.engine.connect() as conn:
        status = conn.execute(
            sa.select(app.tables.jobs.c.status).where(app.tables.jobs.c.id == job_id)
        ).scalar_one()
    assert status == "succeeded"
    if database == "mysql":  # queue and task names compare exactly, whatever the spelling
        assert table_collation(app) == "utf8mb4_bin"


def table_collation(app: dbqueue.App) -> str:
    query = sa.text(
        "SELECT table_collation FROM information_schema.tables "
        "WHERE table_schema = DATABASE() AND table_name = :name"
    )
    with app.engine.connect() as conn:
        return conn.execute(query, {"name": app.names.jobs}).scalar_one()


@pytest.mark.parametrize(
    "url, use",
    [
        (spelled(POSTGRESQL_URL, "postgresql+psycopg", "s3cret"), "postgresql+psycopg2://"),
        (spelled(POSTGRESQL_URL, "postgres+pg8000", "s3cret"), "postgresql+psycopg2://"),
        (spelled(MYSQL_URL, "mysql+mysqldb", "s3cret"), "mysql+pymysql://"),
        (spelled(MYSQL_URL, "mariadb+mariadbconnector", "s3cret"), "mysql+pymysql://"),
    ],
)
def test_a_driver_that_is_not_installed_is_named_with_the_one_to_use(url: str, use: str) -> None:
    app = dbqueue.App(url, table_prefix=URL_PREFIX)
    for attempt in (lambda: app.enqueue(None, "note", {}), lambda: app.run_worker(burst=True)):
        with pytest.raises(dbqueue.ConfigurationError) as caught:
            attempt()
        message = str(caught.value)
        assert f"use {use}" in message, message
        assert "s3cret" not in message and "\n" not in message, message


def test_an_in_memory_sqlite_database_is_refused_naming_a_file() -> None:
    # Each connection of an in-memory database has one of its own: a worker would see no jobs.
    app = dbqueue.App("sqlite://", table_prefix=URL_PREFIX)
    with pytest.raises(dbqueue.ConfigurationError, match=r"use a file, e\.g\. sqlite:///"):
        app.run_worker(burst=True)
    with pytest.raises(dbqueue.ConfigurationError, match="in-memory"):
        dbqueue.App("sqlite:///:memory:").enqueue(None, "note", {})


def test_offline_migration_sql_accepts_postgres_urls() -> None:
    names = dbqueue.App(table_prefix=URL_PREFIX, environ={}).names
    sql = migrate.upgrade_sql(spelled(POSTGRESQL_URL, "postgres", "s3cret"), names)
    assert "JSONB" in sql and "s3cret" not in sql


def test_an_unreachable_postgres_url_is_reported_without_its_password() -> None:
    url = spelled(POSTGRESQL_URL, "postgres", "s3cret")
    app = dbqueue.App(sa.engine.make_url(url).set(port=1).render_as_string(False))
    with pytest.raises(dbqueue.DatabaseUnavailableError) as caught:
        app.run_worker(burst=True, install_signal_handlers=False)
    message = str(caught.value)
    assert "postgres://" in message and "s3cret" not in message, message

"""Compile-only checks per database, and capability flags read from the server version."""

from __future__ import annotations

import pytest
from sqlalchemy.dialects import mysql, postgresql, sqlite

import dbqueue
from dbqueue import strategies
from dbqueue.dialects import MySQLDialect, PostgresDialect, SQLiteDialect
from dbqueue.engine import QueueEngine
from dbqueue.schema import TableNames, tables_for


def sa_dialect(module, version, mariadb=False):
    dialect = module.dialect()
    dialect.server_version_info = version
    if mariadb:
        dialect.is_mariadb = True
    return dialect


def claim_sql(dialect_cls, sa_dialect_obj, strategy):
    engine = QueueEngine(tables_for(TableNames.resolve()), dialect_cls(sa_dialect_obj))
    stmt = engine.runnable("default", 10)
    if strategy == "skip_locked":
        stmt = stmt.with_for_update(skip_locked=True)
    return str(stmt.compile(dialect=sa_dialect_obj)).upper()


def test_postgresql_claim_is_one_ordered_locking_read():
    sql = claim_sql(PostgresDialect, sa_dialect(postgresql, (15, 4)), "skip_locked")
    assert "FOR UPDATE SKIP LOCKED" in sql
    assert "ORDER BY DBQUEUE_JOBS.PRIORITY, DBQUEUE_JOBS.RUN_AT, DBQUEUE_JOBS.ID" in sql
    assert "STATEMENT_TIMESTAMP()" in sql


def test_mysql_claim_uses_utc_clock():
    sql = claim_sql(MySQLDialect, sa_dialect(mysql, (8, 0, 36)), "skip_locked")
    assert "FOR UPDATE SKIP LOCKED" in sql and "UTC_TIMESTAMP(6)" in sql


def test_sqlite_claim_has_no_for_update():
    # SQLAlchemy drops FOR UPDATE on SQLite; dbqueue never relies on it there.
    sql = claim_sql(SQLiteDialect, sa_dialect(sqlite, (3, 40, 1)), "sqlite")
    assert "FOR UPDATE" not in sql and "STRFTIME" in sql


@pytest.mark.parametrize(
    "version, mariadb, supported",
    [
        ((5, 7, 44), False, False),
        ((8, 0, 0), False, False),
        ((8, 0, 1), False, True),
        ((10, 5, 22), True, False),
        ((10, 6, 0), True, True),
        ((11, 4, 2), True, True),
    ],
)
def test_skip_locked_is_refused_on_servers_without_it(version, mariadb, supported):
    dialect = MySQLDialect(sa_dialect(mysql, version, mariadb))
    assert dialect.supports_skip_locked is supported
    if supported:
        assert strategies.create("skip_locked", dialect).name == "skip_locked"
        return
    with pytest.raises(dbqueue.StrategyNotSupportedError) as error:
        strategies.create("skip_locked", dialect)
    message = str(error.value)
    assert ".".join(map(str, version)) in message
    assert "MySQL >= 8.0.1 or MariaDB >= 10.6" in message
    assert "--strategy" in message  # says what to use instead


def test_each_database_defaults_to_its_strategy():
    assert (
        strategies.create(None, PostgresDialect(sa_dialect(postgresql, (15,)))).name
        == "skip_locked"
    )
    assert strategies.create(None, SQLiteDialect(sa_dialect(sqlite, (3, 40)))).name == "sqlite"
    with pytest.raises(dbqueue.StrategyNotSupportedError, match="SQLite has no row locks"):
        strategies.create("skip_locked", SQLiteDialect(sa_dialect(sqlite, (3, 40))))
    with pytest.raises(dbqueue.StrategyNotSupportedError, match="one writer at a time"):
        strategies.create("sqlite", PostgresDialect(sa_dialect(postgresql, (15,))))

"""Compile-only checks per database, and capability flags read from the server version."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mssql, mysql, postgresql, sqlite

import dbqueue
from dbqueue import strategies
from dbqueue.dialects import MySQLDialect, PostgresDialect, SQLiteDialect
from dbqueue.engine import QueueEngine
from dbqueue.schema.tables import TableNames, tables_for


def sa_dialect(module, version, mariadb=False):
    dialect = module.dialect()
    dialect.server_version_info = version
    if mariadb:
        dialect.is_mariadb = True
    return dialect


def claim_sql(dialect_cls, sa_dialect_obj, strategy):
    engine = QueueEngine(tables_for(TableNames.resolve()), dialect_cls(sa_dialect_obj))
    stmt = engine.claims.runnable("default", 10)
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


# ---- the schema layer sits below the database modules -----------------------------------------
SCHEMA_LAYER = ("schema/tables.py", "schema/types.py")


@pytest.mark.parametrize("module", SCHEMA_LAYER)
def test_the_schema_layer_never_imports_the_dialects(module):
    tree = ast.parse((Path(dbqueue.__file__).parent / module).read_text())
    ours = []  # dbqueue's own modules this one imports, anywhere in it
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or node.module.startswith("dbqueue")):
            ours += [f"{node.module or ''}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            ours += [alias.name for alias in node.names if alias.name.startswith("dbqueue")]
    assert not [name for name in ours if "dialects" in name.split(".")], ours


def test_a_program_importing_only_the_schema_compiles_each_database_s_types():
    # The database modules register their types when imported; `import dbqueue.schema` must
    # have run that registration (through dbqueue/__init__) before any table compiles.
    script = """
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from dbqueue.schema import TableNames, tables_for

jobs = tables_for(TableNames.resolve()).jobs
for module in (postgresql, mysql, sqlite):
    print(sa.schema.CreateTable(jobs).compile(dialect=module.dialect()))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert "payload JSONB" in out and "run_at TIMESTAMP WITH TIME ZONE DEFAULT now()" in out
    assert "payload JSON" in out and "DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))" in out
    assert "DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))" in out


def test_a_database_without_a_module_is_refused_when_its_table_compiles():
    jobs = tables_for(TableNames.resolve()).jobs
    with pytest.raises(dbqueue.ConfigurationError, match="does not support the database 'mssql'"):
        sa.schema.CreateTable(jobs).compile(dialect=mssql.dialect())


def test_postgresql_job_lock_keys_are_a_stem_hash_xor_the_id() -> None:
    """A job's advisory-lock key is what the claim computes in SQL (stem hash # id): the ids
    of one table never share a key, and names without a number keep their own hash."""
    from dbqueue.dialects.postgresql import _hash64, lock_key

    stem = "q_jobs:job:"
    keys = {lock_key(f"{stem}{job_id}") for job_id in range(10_000)}
    assert len(keys) == 10_000
    assert lock_key(f"{stem}42") == _hash64(stem) ^ 42
    biggest = 2**63 - 1
    assert lock_key(f"{stem}{biggest}") == _hash64(stem) ^ biggest
    assert -(2**63) <= lock_key(f"{stem}{biggest}") < 2**63
    assert lock_key("q_jobs:routine:rescue") == _hash64("q_jobs:routine:rescue")
    assert lock_key(f"{stem}{2**64}") == _hash64(f"{stem}{2**64}")

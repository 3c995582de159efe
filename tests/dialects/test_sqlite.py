"""SQLite's ``unflushed_commits``: a lock claim's mark commits with ``synchronous = NORMAL`` (no
sync of the log), and the connection comes back to its own level for every other commit."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

import dbqueue
from dbqueue.dialects import SQLiteDialect


@pytest.fixture
def engine(tmp_path: Path) -> sa.Engine:
    app = dbqueue.App(f"sqlite:///{tmp_path / 'queue.db'}")
    app.migrate()
    return app.create_engine()


def _level(conn: sa.Connection) -> int:
    return conn.connection.dbapi_connection.execute("PRAGMA synchronous").fetchone()[0]


def test_a_block_commits_unflushed_and_the_connection_comes_back_to_its_level(engine) -> None:
    dialect = SQLiteDialect(engine.dialect)
    with engine.connect() as conn:
        assert _level(conn) == 2  # FULL: dbqueue leaves the user's durability as it is
        with dialect.unflushed_commits(conn), conn.begin():
            assert _level(conn) == 1  # NORMAL for this transaction's commit
            conn.execute(sa.text("SELECT 1"))
        assert _level(conn) == 2
        with pytest.raises(RuntimeError), dialect.unflushed_commits(conn), conn.begin():
            raise RuntimeError("the mark failed")
        assert _level(conn) == 2  # back after a failure too
        # Inside a transaction the level cannot change: left alone.
        with conn.begin(), dialect.unflushed_commits(conn):
            assert _level(conn) == 2


def test_a_connection_whose_commits_are_already_unflushed_is_left_alone(engine) -> None:
    dialect = SQLiteDialect(engine.dialect)
    with engine.connect() as conn:
        conn.connection.dbapi_connection.execute("PRAGMA synchronous = OFF")
        with dialect.unflushed_commits(conn), conn.begin():
            assert _level(conn) == 0
        assert _level(conn) == 0

"""The dialects' transaction shapes on real databases: ``statements_together`` keeps its
statements one transaction even inside ``one_statement_transaction``, whose statements may
otherwise each commit on their own (PostgreSQL's autocommit). A key's line depends on it."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa


def committed_keys(database) -> set[str]:
    engine = database.engine()
    try:
        with engine.connect() as conn:
            keys = database.app().tables.keys
            return set(conn.execute(sa.select(keys.c["key"])).scalars())
    finally:
        engine.dispose()


def add_key(conn: sa.Connection, keys: sa.Table, name: str) -> None:
    now = dt.datetime.now(dt.timezone.utc)
    conn.execute(sa.insert(keys).values(queue="q", key=name, last_seq=1, created_at=now))


def test_statements_together_commit_as_one_and_roll_back_as_one(database):
    app = database.app()
    keys = app.tables.keys
    engine = app.create_engine()
    try:
        with engine.connect() as conn:
            dialect = app.context.queue_engine(conn).dialect
            with dialect.one_statement_transaction(conn):
                add_key(conn, keys, "before")
                with dialect.statements_together(conn):
                    add_key(conn, keys, "a")
                    seen_inside = committed_keys(database)
                    add_key(conn, keys, "b")
                add_key(conn, keys, "after")
            assert "a" not in seen_inside and "b" not in seen_inside
            assert committed_keys(database) == {"before", "a", "b", "after"}
            undone = pytest.raises(RuntimeError, match="undo")
            with undone, dialect.one_statement_transaction(conn), dialect.statements_together(conn):
                add_key(conn, keys, "c")
                raise RuntimeError("undo")
            assert "c" not in committed_keys(database)
            # The connection is itself again: a plain transaction rolls back.
            with conn.begin() as transaction:
                add_key(conn, keys, "d")
                transaction.rollback()
            assert committed_keys(database) == {"before", "a", "b", "after"}
    finally:
        engine.dispose()

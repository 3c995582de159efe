"""``dbqueue migrate``: one line saying what changed, or why nothing could; never a traceback,
and nothing created when it refuses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from support.cli_runner import assert_one_line_error, invoke, unmigrated_prefix

import dbqueue
from dbqueue.migrations import migrate

HEAD = migrate.head_revision()


@pytest.fixture
def fresh_prefix(database) -> Iterator[str]:
    with unmigrated_prefix(database) as prefix:
        yield prefix


def test_tables_created_outside_dbqueue_are_named_not_overwritten(database, fresh_prefix, tmp_path):
    """Tables made by create_all (or a failed run of another tool): Alembic's first CREATE
    TABLE would fail (DuplicateTable); dbqueue names them and the ways out instead."""
    app = dbqueue.App(database.url, table_prefix=fresh_prefix)
    engine = app.create_engine()
    try:
        app.tables.metadata.create_all(engine)
        outcome = invoke(
            ["migrate", "--url", database.url, "--table-prefix", fresh_prefix], tmp_path
        )
        line = assert_one_line_error(
            outcome, f"{fresh_prefix}jobs", "already exist", "no dbqueue migration is recorded"
        )
        assert "--table-prefix" in line and "Drop or rename" in line
        with engine.connect() as conn:
            assert migrate.current_revision(conn, app.names) is None
            assert sa.inspect(conn).has_table(f"{fresh_prefix}jobs")
    finally:
        engine.dispose()


def test_each_run_says_what_it_changed(database, fresh_prefix, tmp_path):
    options = ["--url", database.url, "--table-prefix", fresh_prefix]
    where = f"{fresh_prefix}jobs on "

    def step(*args: str) -> str:
        outcome = invoke(["migrate", *options, *args], tmp_path, database.env())
        assert outcome.exit_code == 0 and outcome.exception is None, outcome
        assert outcome.stderr == "", outcome.stderr  # Alembic's own INFO lines stay quiet
        (line,) = outcome.stdout.splitlines()
        return line

    first = step("0001")
    assert first.startswith(f"migrated {where}") and first.endswith("from none to 0001")
    assert step("0001").startswith(f"nothing to upgrade: {where}")
    assert step().endswith(f"from 0001 to {HEAD}")
    back = step("0001")
    assert back.startswith("nothing to upgrade") and back.endswith("(to go back: --downgrade 0001)")
    assert step("--show") == f"current: {HEAD}  latest: {HEAD}"
    assert step("--downgrade", "0001").endswith(f"from {HEAD} to 0001")
    refused = invoke(["migrate", *options, "--downgrade", HEAD], tmp_path, database.env())
    assert_one_line_error(refused, f"cannot downgrade the queue tables for '{fresh_prefix}jobs'")
    assert step("--downgrade").endswith("from 0001 to none (no tables)")
    assert step("--downgrade").startswith("nothing to downgrade: no dbqueue migration is recorded")

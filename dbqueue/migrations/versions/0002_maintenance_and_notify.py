"""Maintenance bookkeeping, and the NOTIFY trigger that wakes PostgreSQL workers.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22

The trigger is statement-level with a transition table: one NOTIFY per INSERT statement and
queue (not per row), so a bulk enqueue costs one notification, and a plain SQL INSERT by any
client wakes the workers too. Jobs inserted for later notify as well: an idle worker that finds
nothing runnable yet then sleeps until the earliest run_at instead of a whole poll interval.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dbqueue import dialects
from dbqueue.migrations.migrate import script_names, table_options
from dbqueue.schema.tables import MAINTENANCE_ROUTINES, TableNames
from dbqueue.schema.types import UtcDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _notify_names(names: TableNames) -> tuple[str, str, str, str]:
    """(table, function, trigger, channel), quoted for DDL."""
    preparer = op.get_context().dialect.identifier_preparer
    prefix = f"{preparer.quote_schema(names.schema)}." if names.schema else ""
    table = prefix + preparer.quote(names.jobs)
    function = prefix + preparer.quote(f"{names.jobs}_notify")
    trigger = preparer.quote(f"{names.jobs}_notify")
    channel = names.qualified_jobs.replace("'", "''")  # validated identifiers: no quotes anyway
    return table, function, trigger, channel


def _has_notify() -> bool:
    return dialects.for_sqlalchemy(op.get_context().dialect).supports_listen_notify


def upgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    table = op.create_table(
        names.maintenance,
        sa.Column("routine", sa.String(32), primary_key=True),
        sa.Column("last_tick", UtcDateTime(), nullable=True),
        sa.Column("started_at", UtcDateTime(), nullable=True),
        sa.Column("finished_at", UtcDateTime(), nullable=True),
        sa.Column("worker_id", sa.String(255), nullable=True),
        sa.Column("runs", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("result", sa.Text(), nullable=True),
        schema=names.schema,
        **table_options("routine"),
    )
    op.bulk_insert(table, [{"routine": routine} for routine in MAINTENANCE_ROUTINES])
    if _has_notify():
        jobs, function, trigger, channel = _notify_names(names)
        op.execute(
            f"""
            CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE
                q text;
            BEGIN
                FOR q IN SELECT DISTINCT queue FROM new_jobs LOOP
                    PERFORM pg_notify('{channel}', q);
                END LOOP;
                RETURN NULL;
            END
            $$
            """
        )
        op.execute(
            f"CREATE TRIGGER {trigger} AFTER INSERT ON {jobs} "
            f"REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
        )


def downgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    if _has_notify():
        jobs, function, trigger, _ = _notify_names(names)
        op.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {jobs}")
        op.execute(f"DROP FUNCTION IF EXISTS {function}()")
    op.drop_table(names.maintenance, schema=names.schema)

"""The registry of live workers, and the enqueuer's trace context on each job.

Revision ID: 0007_workers
Revises: 0004
Create Date: 2026-11-24

A small table keyed by a string (no other key, no foreign key: SingleStore shards it on the id),
one row per worker process; and one nullable column on the jobs table (no default, so adding it
rewrites no row), written only when tracing is on (``dbqueue.tracing``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dbqueue.migrations.migrate import script_names, table_options
from dbqueue.schema.tables import MAX_TRACEPARENT, NowDefault, TableNames
from dbqueue.schema.types import Payload, UtcDateTime

revision = "0007_workers"
down_revision = "0006_unique"
branch_labels = None
depends_on = None


def _now() -> sa.schema.DefaultClause:
    return sa.schema.DefaultClause(NowDefault())


def upgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    op.add_column(
        names.jobs,
        sa.Column("traceparent", sa.String(MAX_TRACEPARENT), nullable=True),
        schema=names.schema,
    )
    op.create_table(
        names.workers,
        sa.Column("id", sa.String(64), primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", Payload(), nullable=True),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("strategy", sa.String(32), nullable=False),
        sa.Column("started_at", UtcDateTime(), nullable=False, server_default=_now()),
        sa.Column("heartbeat_at", UtcDateTime(), nullable=False, server_default=_now()),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("jobs", Payload(), nullable=True),
        sa.Column("processed", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("failed", sa.BigInteger(), nullable=False, server_default="0"),
        schema=names.schema,
        **table_options("id"),
    )


def downgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    op.drop_table(names.workers, schema=names.schema)
    with op.batch_alter_table(names.jobs, schema=names.schema) as batch:
        batch.drop_column("traceparent")

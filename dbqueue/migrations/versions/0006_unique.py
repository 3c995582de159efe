"""Unique jobs and coalescing: the jobs table's ``unique_key`` and ``scored_payloads``, and the
table of held keys.

Revision ID: 0006_unique
Revises: 0005_keys
Create Date: 2026-11-24

A nullable column without default (adding it rewrites no row) and a small table whose only key
is its composite primary key (queue, unique_key): no unique index, trigger or foreign key, so it
suits SingleStore too (sharded on unique_key, part of the primary key).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dbqueue.migrations.migrate import script_names, table_options
from dbqueue.schema.tables import MAX_UNIQUE_KEY, NowDefault, TableNames
from dbqueue.schema.types import Payload, UtcDateTime

revision = "0006_unique"
down_revision = "0005_keys"
branch_labels = None
depends_on = None


def upgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    op.add_column(
        names.jobs,
        sa.Column("unique_key", sa.String(MAX_UNIQUE_KEY), nullable=True),
        schema=names.schema,
    )
    op.add_column(
        names.jobs, sa.Column("scored_payloads", Payload(), nullable=True), schema=names.schema
    )
    op.create_table(
        names.unique,
        sa.Column("queue", sa.String(64), primary_key=True, autoincrement=False),
        sa.Column("unique_key", sa.String(MAX_UNIQUE_KEY), primary_key=True, autoincrement=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("rerun_id", sa.BigInteger(), nullable=True),
        sa.Column("rerun_at", UtcDateTime(), nullable=True),
        sa.Column("conflicts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column(
            "created_at",
            UtcDateTime(),
            nullable=False,
            server_default=sa.schema.DefaultClause(NowDefault()),
        ),
        schema=names.schema,
        **table_options("unique_key"),
    )


def downgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    op.drop_table(names.unique, schema=names.schema)
    with op.batch_alter_table(names.jobs, schema=names.schema) as batch:
        batch.drop_column("scored_payloads")
        batch.drop_column("unique_key")

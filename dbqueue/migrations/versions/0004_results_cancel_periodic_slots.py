"""Results, cancel requests, periodic ticks and queue-limit slots.

Revision ID: 0004
Revises: 0003_subscriptions
Create Date: 2026-11-23

Three nullable columns on the jobs table (no default, so adding them rewrites no row on any
database) — ``result``; ``awaited``, set when a caller of ``app.call`` waits for the job, whose
end is then announced; ``cancel_requested_at`` —, two small tables with composite primary keys
and nothing else, which suits SingleStore too (sharded on the key's first column), and the
cancel requests of running jobs (a surrogate key and a plain index on job_id).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dbqueue.migrations.migrate import script_names, table_options
from dbqueue.schema.tables import NowDefault, TableNames
from dbqueue.schema.types import Payload, UtcDateTime

revision = "0004"
down_revision = "0003_subscriptions"
branch_labels = None
depends_on = None


def upgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    op.add_column(names.jobs, sa.Column("result", Payload(), nullable=True), schema=names.schema)
    op.add_column(
        names.jobs, sa.Column("awaited", sa.Boolean(), nullable=True), schema=names.schema
    )
    op.add_column(
        names.jobs,
        sa.Column("cancel_requested_at", UtcDateTime(), nullable=True),
        schema=names.schema,
    )
    op.create_table(
        names.periodic,
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("tick", UtcDateTime(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column(
            "created_at",
            UtcDateTime(),
            nullable=False,
            server_default=sa.schema.DefaultClause(NowDefault()),
        ),
        sa.PrimaryKeyConstraint("name", "tick"),
        schema=names.schema,
        **table_options("name"),
    )
    op.create_table(
        names.slots,
        sa.Column("queue", sa.String(64), primary_key=True, autoincrement=False),
        sa.Column("slot", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("worker_id", sa.String(255), nullable=True),
        sa.Column("taken_at", UtcDateTime(), nullable=True),
        schema=names.schema,
        **table_options("queue"),
    )
    op.create_table(
        names.cancels,
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "requested_at",
            UtcDateTime(),
            nullable=False,
            server_default=sa.schema.DefaultClause(NowDefault()),
        ),
        schema=names.schema,
        **table_options("id"),
    )
    op.create_index(f"{names.cancels}_job", names.cancels, ["job_id"], schema=names.schema)


def downgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    op.drop_table(names.cancels, schema=names.schema)
    op.drop_table(names.slots, schema=names.schema)
    op.drop_table(names.periodic, schema=names.schema)
    with op.batch_alter_table(names.jobs, schema=names.schema) as batch:
        batch.drop_column("cancel_requested_at")
        batch.drop_column("awaited")
        batch.drop_column("result")

"""The pub/sub subscriptions table: who receives each topic, by code or by webhook.

Revision ID: 0003_subscriptions
Revises: 0002
Create Date: 2026-11-23

A string primary key and one plain index, nothing else: no foreign key to the jobs table, no
unique key and no trigger, so the same DDL suits SingleStore (no foreign keys, no triggers, unique
keys only with the shard key). Publications and deliveries live in the jobs table, which already
has ``publication_id`` and ``subscription_id``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dbqueue.migrations.migrate import script_names
from dbqueue.schema.tables import NowDefault, TableNames
from dbqueue.schema.types import Payload, UtcDateTime

revision = "0003_subscriptions"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    t = names.subscriptions
    op.create_table(
        t,
        sa.Column("id", sa.String(100), primary_key=True, autoincrement=False),
        sa.Column("topic", sa.String(200), nullable=False),
        sa.Column("tenant", sa.BigInteger(), nullable=True),
        sa.Column("business_group", sa.String(100), nullable=True),
        sa.Column("url", sa.Text(), nullable=True),
        sa.Column("http_method", sa.String(8), nullable=True, server_default="POST"),
        sa.Column("headers", Payload(), nullable=True),
        sa.Column("active", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column(
            "created_at",
            UtcDateTime(),
            nullable=False,
            server_default=sa.schema.DefaultClause(NowDefault()),
        ),
        schema=names.schema,
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
        mysql_collate="utf8mb4_bin",
    )
    op.create_index(f"{t}_topic", t, ["topic"], schema=names.schema)


def downgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    op.drop_index(f"{names.subscriptions}_topic", names.subscriptions, schema=names.schema)
    op.drop_table(names.subscriptions, schema=names.schema)

"""Keys: jobs of one queue sharing a key run one at a time (and, by default, in enqueue order).

Revision ID: 0005_keys
Revises: 0004
Create Date: 2026-11-24

Two nullable columns on the jobs table (no default: adding them rewrites no row) — ``key`` and
``key_seq``, the job's place in its key's line —, an index that finds the next job of a key
(partial where the database can, so unkeyed jobs write no entry), and the busy-keys table: a
composite primary key and nothing else, which suits SingleStore (sharded on ``queue``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dbqueue.migrations.migrate import script_names, table_options
from dbqueue.schema.tables import NowDefault, TableNames
from dbqueue.schema.types import UtcDateTime

revision = "0005_keys"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    t = names.jobs
    op.add_column(t, sa.Column("key", sa.String(255), nullable=True), schema=names.schema)
    op.add_column(t, sa.Column("key_seq", sa.BigInteger(), nullable=True), schema=names.schema)
    keyed = sa.column("key").isnot(None)  # quoted where KEY is a reserved word
    op.create_index(
        f"{t}_key",
        t,
        ["key", "queue", "status", "key_seq"],
        schema=names.schema,
        postgresql_where=keyed,
        sqlite_where=keyed,
    )
    op.create_table(
        names.keys,
        sa.Column("queue", sa.String(64), primary_key=True, autoincrement=False),
        sa.Column("key", sa.String(255), primary_key=True, autoincrement=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column(
            "created_at",
            UtcDateTime(),
            nullable=False,
            server_default=sa.schema.DefaultClause(NowDefault()),
        ),
        schema=names.schema,
        **table_options("queue"),
    )


def downgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    op.drop_table(names.keys, schema=names.schema)
    op.drop_index(f"{names.jobs}_key", names.jobs, schema=names.schema)
    with op.batch_alter_table(names.jobs, schema=names.schema) as batch:
        batch.drop_column("key_seq")
        batch.drop_column("key")

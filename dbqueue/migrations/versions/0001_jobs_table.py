"""The jobs table and the indexes its claim, purge and equivalence queries use.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dbqueue.migrations.migrate import script_names, table_options
from dbqueue.schema.tables import NowDefault, TableNames
from dbqueue.schema.types import Payload, UtcDateTime

revision = "0001"
down_revision = None
branch_labels = ("dbqueue",)
depends_on = None


def _now() -> sa.schema.DefaultClause:
    return sa.schema.DefaultClause(NowDefault())


def upgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    t = names.jobs
    op.create_table(
        t,
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("queue", sa.String(64), nullable=False, server_default="default"),
        sa.Column("task", sa.String(200), nullable=False),
        sa.Column("payload", Payload(), nullable=True),
        sa.Column("payload_hash", sa.String(64), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False, server_default="50"),
        sa.Column("status", sa.String(16), nullable=False, server_default="available"),
        sa.Column("run_at", UtcDateTime(), nullable=False, server_default=_now()),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("max_attempts", sa.Integer(), nullable=False, server_default="100"),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("worker_id", sa.String(255), nullable=True),
        sa.Column("origin", sa.String(255), nullable=True),
        sa.Column("destination", sa.String(255), nullable=True),
        sa.Column("external_key", sa.String(255), nullable=True),
        sa.Column("tenant", sa.BigInteger(), nullable=True),
        sa.Column("business_group", sa.String(100), nullable=True),
        sa.Column("publication_id", sa.BigInteger(), nullable=True),
        sa.Column("subscription_id", sa.String(100), nullable=True),
        sa.Column("dead", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("live_id", sa.BigInteger(), nullable=True),
        sa.Column("first_attempt_at", UtcDateTime(), nullable=True),
        sa.Column("previous_attempt_at", UtcDateTime(), nullable=True),
        sa.Column("previous_status", sa.String(16), nullable=True),
        sa.Column("previous_message", sa.Text(), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False, server_default=_now()),
        sa.Column("started_at", UtcDateTime(), nullable=True),
        sa.Column("finished_at", UtcDateTime(), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False, server_default=_now()),
        schema=names.schema,
        **table_options("id"),
    )
    op.create_index(
        f"{t}_claim", t, ["status", "queue", "priority", "run_at", "id"], schema=names.schema
    )
    # Partial where the database can (finished jobs only): an enqueue then writes no entry here.
    finished = sa.text("finished_at IS NOT NULL")
    op.create_index(
        f"{t}_finished",
        t,
        ["finished_at"],
        schema=names.schema,
        postgresql_where=finished,
        sqlite_where=finished,
    )
    op.create_index(f"{t}_equivalent", t, ["task", "payload_hash"], schema=names.schema)


def downgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    op.drop_table(names.jobs, schema=names.schema)

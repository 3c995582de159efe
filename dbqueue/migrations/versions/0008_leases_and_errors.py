"""Leases for jobs run outside the claim's transaction, and every attempt's error.

Revision ID: 0008_leases_and_errors
Revises: 0007_workers
Create Date: 2026-11-28

Two nullable columns on the jobs table, with no default, so adding them rewrites no row:
``lease_until`` (a job running outside its claim's transaction belongs to its worker until then;
the worker's heartbeat moves it on, rescue retries the job once it has passed) and ``errors``
(one JSON object per failed attempt: when, which attempt, the message, the handler's frames).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dbqueue.migrations.migrate import script_names
from dbqueue.schema.tables import TableNames
from dbqueue.schema.types import Payload, UtcDateTime

revision = "0008_leases_and_errors"
down_revision = "0007_workers"
branch_labels = None
depends_on = None


def upgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    op.add_column(
        names.jobs, sa.Column("lease_until", UtcDateTime(), nullable=True), schema=names.schema
    )
    op.add_column(names.jobs, sa.Column("errors", Payload(), nullable=True), schema=names.schema)


def downgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    with op.batch_alter_table(names.jobs, schema=names.schema) as batch:
        batch.drop_column("errors")
        batch.drop_column("lease_until")

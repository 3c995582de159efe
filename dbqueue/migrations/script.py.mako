"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dbqueue.migrate import script_names
from dbqueue.schema import TableNames
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    ${upgrades if upgrades else "pass"}


def downgrade(names: TableNames | None = None) -> None:
    names = script_names(names)
    ${downgrades if downgrades else "pass"}

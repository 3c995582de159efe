"""``dbqueue.alembic``: dbqueue inside an application's own Alembic project.

A documented import path, kept: the code lives in ``dbqueue.migrations.alembic``."""

from dbqueue.migrations.alembic import (
    IncludeObject,
    downgrade,
    include_object,
    include_object_with,
    is_dbqueue_table,
    queue_names,
    upgrade,
)

__all__ = [
    "IncludeObject",
    "is_dbqueue_table",
    "include_object",
    "include_object_with",
    "upgrade",
    "downgrade",
    "queue_names",
]

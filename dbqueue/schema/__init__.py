"""The queue tables as SQLAlchemy Core ``Table`` objects (``tables.py``) and the column types
they use (``types.py``). ``dbqueue.schema.TableNames`` is part of the public API (Alembic
revisions name a queue with it)."""

from dbqueue.schema.tables import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PREFIX,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    QueueTables,
    TableNames,
    tables_for,
)

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_PREFIX",
    "DEFAULT_PRIORITY",
    "DEFAULT_QUEUE",
    "QueueTables",
    "TableNames",
    "tables_for",
]

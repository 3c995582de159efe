"""Internal: the database modules (one per database: all that differs between them), the
lookup from a URL or SQLAlchemy dialect to one of them, and the engine factory that configures
SQLAlchemy the way each database needs it."""

from __future__ import annotations

from dbqueue.dialects.base import WRITE_INTENT, Dialect
from dbqueue.dialects.connect import (
    create_async_engine,
    create_engine,
    is_configured,
    resolve_url,
    sync_url,
)
from dbqueue.dialects.mysql import MySQLDialect
from dbqueue.dialects.postgresql import PostgresDialect
from dbqueue.dialects.registry import (
    BY_NAME,
    DIALECT_CLASSES,
    DIALECT_NAMES,
    class_for_sqlalchemy_name,
    class_for_url,
    for_sqlalchemy,
)
from dbqueue.dialects.sqlite import SQLiteDialect

__all__ = [
    "WRITE_INTENT",
    "Dialect",
    "MySQLDialect",
    "PostgresDialect",
    "SQLiteDialect",
    "BY_NAME",
    "DIALECT_CLASSES",
    "DIALECT_NAMES",
    "class_for_sqlalchemy_name",
    "class_for_url",
    "create_async_engine",
    "create_engine",
    "for_sqlalchemy",
    "is_configured",
    "resolve_url",
    "sync_url",
]

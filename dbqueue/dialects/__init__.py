"""Internal: the database modules (one per database: all that differs between them), the
lookup from a URL or SQLAlchemy dialect to one of them, and the engine factory that configures
SQLAlchemy the way each database needs it.

The database modules are imported when first used (``registry``); their classes and the tables
of all of them are still importable from here, and importing one of those imports it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dbqueue.dialects.base import WRITE_INTENT, Dialect
from dbqueue.dialects.connect import (
    create_async_engine,
    create_engine,
    is_configured,
    resolve_url,
    sync_url,
)
from dbqueue.dialects.registry import (
    DIALECT_NAMES,
    class_for_name,
    class_for_sqlalchemy_name,
    class_for_url,
    for_sqlalchemy,
)

if TYPE_CHECKING:
    from dbqueue.dialects.mysql import MySQLDialect
    from dbqueue.dialects.postgresql import PostgresDialect
    from dbqueue.dialects.registry import BY_NAME, DIALECT_CLASSES
    from dbqueue.dialects.sqlite import SQLiteDialect

#: Names loaded on first use → the module that defines them.
_LAZY = {
    "MySQLDialect": "dbqueue.dialects.mysql",
    "PostgresDialect": "dbqueue.dialects.postgresql",
    "SQLiteDialect": "dbqueue.dialects.sqlite",
    "BY_NAME": "dbqueue.dialects.registry",
    "DIALECT_CLASSES": "dbqueue.dialects.registry",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "WRITE_INTENT",
    "Dialect",
    "MySQLDialect",
    "PostgresDialect",
    "SQLiteDialect",
    "BY_NAME",
    "DIALECT_CLASSES",
    "DIALECT_NAMES",
    "class_for_name",
    "class_for_sqlalchemy_name",
    "class_for_url",
    "create_async_engine",
    "create_engine",
    "for_sqlalchemy",
    "is_configured",
    "resolve_url",
    "sync_url",
]

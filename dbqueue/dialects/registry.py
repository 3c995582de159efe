"""Which dialect module serves a URL or a SQLAlchemy dialect."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine.interfaces import Dialect as SADialect

from dbqueue.base.distribution import install_hint
from dbqueue.dialects.base import Dialect
from dbqueue.dialects.mysql import MySQLDialect
from dbqueue.dialects.postgresql import PostgresDialect
from dbqueue.dialects.sqlite import SQLiteDialect
from dbqueue.errors import ConfigurationError
from dbqueue.schema.types import DatabaseTypes

DIALECT_CLASSES: tuple[type[Dialect], ...] = (PostgresDialect, MySQLDialect, SQLiteDialect)

try:  # SingleStore support is an optional extra
    from dbqueue.dialects.singlestore import SingleStoreDialect

    DIALECT_CLASSES += (SingleStoreDialect,)
except ImportError:  # pragma: no cover - exercised only without the module
    pass

BY_NAME: dict[str, type[Dialect]] = {cls.name: cls for cls in DIALECT_CLASSES}
_BY_SQLALCHEMY_NAME = {alias: cls for cls in DIALECT_CLASSES for alias in cls.sqlalchemy_names}
_BY_URL_ALIAS = {alias: cls for cls in DIALECT_CLASSES for alias in cls.url_aliases}
DIALECT_NAMES = ("postgresql", "mysql", "singlestore", "sqlite")
#: SQLAlchemy dialect names served by a module that needs an optional extra.
_EXTRAS = {"singlestoredb": "singlestore"}


def class_for_sqlalchemy_name(name: str) -> type[Dialect]:
    try:
        return _BY_SQLALCHEMY_NAME[name]
    except KeyError:
        if name in _EXTRAS:
            raise ConfigurationError(
                f"the {name!r} database needs its optional driver: {install_hint(_EXTRAS[name])}"
            ) from None
        raise ConfigurationError(
            f"dbqueue does not support the database {name!r}: use PostgreSQL, MySQL/MariaDB, "
            "SingleStore or SQLite"
        ) from None


def class_for_url(url: sa.engine.URL) -> type[Dialect]:
    backend = url.get_backend_name()
    return _BY_URL_ALIAS.get(backend) or class_for_sqlalchemy_name(backend)


def for_sqlalchemy(sa_dialect: SADialect) -> Dialect:
    """The Dialect for a connected SQLAlchemy dialect (its server version is known by then)."""
    cached = sa_dialect.__dict__.get("_dbqueue_dialect")
    if cached is not None:
        return cached
    dialect = class_for_sqlalchemy_name(sa_dialect.name)(sa_dialect)
    if sa_dialect.server_version_info is not None:
        sa_dialect.__dict__["_dbqueue_dialect"] = dialect
    return dialect


def database_types(sqlalchemy_name: str) -> DatabaseTypes:
    """The column types the queue tables get on one database (handed to the schema layer)."""
    return class_for_sqlalchemy_name(sqlalchemy_name).database_types()

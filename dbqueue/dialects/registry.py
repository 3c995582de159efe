"""Which dialect module serves a URL or a SQLAlchemy dialect.

A database's module is imported the first time a URL or an engine names that database: each one
loads SQLAlchemy's dialect for it (SingleStore's, a third-party package), which a program on
one database never needs for the others, nor ``import dbqueue`` or ``dbqueue --help``.
So the lookup tables below name modules, and the names they map from are written out here
(tests hold them to each class's ``sqlalchemy_names`` and ``url_aliases``).
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

from dbqueue.base.distribution import install_hint
from dbqueue.errors import ConfigurationError

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.engine.interfaces import Dialect as SADialect

    from dbqueue.dialects.base import Dialect
    from dbqueue.schema.types import DatabaseTypes

#: dbqueue's name for each database (the ``--dialect`` choices) → its module and class.
MODULES: dict[str, tuple[str, str]] = {
    "postgresql": ("dbqueue.dialects.postgresql", "PostgresDialect"),
    "mysql": ("dbqueue.dialects.mysql", "MySQLDialect"),
    "singlestore": ("dbqueue.dialects.singlestore", "SingleStoreDialect"),
    "sqlite": ("dbqueue.dialects.sqlite", "SQLiteDialect"),
}
DIALECT_NAMES = tuple(MODULES)
#: Each SQLAlchemy dialect name (``engine.dialect.name``) → dbqueue's name for the database.
SQLALCHEMY_NAMES = {
    "postgresql": "postgresql",
    "mysql": "mysql",
    "mariadb": "mysql",
    "singlestoredb": "singlestore",
    "sqlite": "sqlite",
}
#: Other names a URL may give a database before ``+driver`` → dbqueue's name for it.
URL_ALIASES = {"postgres": "postgresql"}
#: Databases whose module needs an optional extra → that extra.
_EXTRAS = {"singlestore": "singlestore"}


@functools.cache
def class_for_name(name: str) -> type[Dialect]:
    """The module of a database by dbqueue's name for it, imported the first time it is asked."""
    module_name, class_name = MODULES[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if name not in _EXTRAS:
            raise
        raise ConfigurationError(
            f"the {name} database needs its optional driver ({exc}): {install_hint(_EXTRAS[name])}"
        ) from None
    return getattr(module, class_name)


def class_for_sqlalchemy_name(name: str) -> type[Dialect]:
    try:
        ours = SQLALCHEMY_NAMES[name]
    except KeyError:
        raise ConfigurationError(
            f"dbqueue does not support the database {name!r}: use PostgreSQL, MySQL/MariaDB, "
            "SingleStore or SQLite"
        ) from None
    return class_for_name(ours)


def class_for_url(url: sa.engine.URL) -> type[Dialect]:
    backend = url.get_backend_name()
    if backend in URL_ALIASES:
        return class_for_name(URL_ALIASES[backend])
    return class_for_sqlalchemy_name(backend)


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


def installed_classes() -> tuple[type[Dialect], ...]:
    """Every database module whose driver is installed (each one imported: for tests and tools
    that go through all of them, never on the way to a database)."""
    found = []
    for name in MODULES:
        try:
            found.append(class_for_name(name))
        except ConfigurationError:
            continue
    return tuple(found)


def __getattr__(name: str) -> Any:
    """``DIALECT_CLASSES`` and ``BY_NAME``: the installed modules, each imported when asked."""
    if name == "DIALECT_CLASSES":
        return installed_classes()
    if name == "BY_NAME":
        return {cls.name: cls for cls in installed_classes()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

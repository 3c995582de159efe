"""Column types shared by every database; dialect modules supply native variants.

This module sits below the dialect modules, so it never imports them: the package's composition
root (``dbqueue/__init__.py``, which Python runs before any ``dbqueue.…`` module) hands it the
function that asks them (``use_database_types``), and a table compiles for any database whatever
module a program imports.

Payloads are encoded once in Python (canonical JSON, to hash and size-check them) and bound as
text. On the way out they are decoded leniently: a row written by hand with broken JSON yields a
MalformedPayload that fails that one job, instead of an exception that stops the claim loop.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from dbqueue.base import payload as payload_codec
from dbqueue.errors import ConfigurationError


def _bind_payload(value: Any) -> Any:
    """Bound as an exact str: drivers bind their own types fastest, and a str subclass makes
    sqlite3 look for an adapter (twice the binding's cost) and psycopg2 walk its MRO."""
    if value is None:
        return None
    if not isinstance(value, payload_codec.EncodedPayload):
        value = payload_codec.encode(value, max_bytes=None)
    return str(value)


class PayloadProcessing:
    """Mixin giving a text-like column dbqueue's payload encoding and lenient decoding."""

    cache_ok = True

    def bind_processor(self, dialect: Any) -> Any:
        return _bind_payload

    def result_processor(self, dialect: Any, coltype: Any) -> Any:
        return payload_codec.decode

    def adapt(self, cls: Any, **kw: Any) -> Any:
        # A driver's own text type (asyncpg's, in its dialect's colspecs) would replace this
        # one, and its processing with it: adapt to that type with this processing on top.
        if not issubclass(cls, PayloadProcessing):
            cls = _with_payload_processing(cls)
        return super().adapt(cls, **kw)  # type: ignore[misc]


@functools.cache
def _with_payload_processing(cls: type) -> type:
    return type(f"Payload{cls.__name__}", (PayloadProcessing, cls), {})


class JsonText(PayloadProcessing, sa.Text):
    """The portable payload column (SQLite): JSON as text."""


class NativeJson(sa.types.UserDefinedType):
    """A database's own JSON column type, fed dbqueue's encoded text.

    A UserDefinedType because SQLAlchemy would swap a JSON/JSONB subclass for its driver's
    implementation, which JSON-encodes the already-encoded text a second time.
    ``driver_decodes``: the driver returns Python objects already (psycopg2 with jsonb).
    """

    cache_ok = True

    def __init__(self, ddl_name: str = "JSON", driver_decodes: bool = False) -> None:
        self.ddl_name = ddl_name
        self.driver_decodes = driver_decodes

    def get_col_spec(self, **kw: Any) -> str:
        return self.ddl_name

    def bind_processor(self, dialect: Any) -> Any:
        return _bind_payload

    def result_processor(self, dialect: Any, coltype: Any) -> Any:
        return None if self.driver_decodes else payload_codec.decode


@dataclass(frozen=True)
class DatabaseTypes:
    """What one database needs in the queue tables: its payload and timestamp column types
    (None: the portable ones) and the DDL default that gives timestamps the UTC clock, so that
    plain SQL INSERTs get the same clock as dbqueue's."""

    payload: sa.types.TypeEngine | None
    timestamp: sa.types.TypeEngine | None
    server_now: Any


#: SQLAlchemy dialect name → that database's types; set by the composition root.
_database_types: Callable[[str], DatabaseTypes] | None = None


def use_database_types(provider: Callable[[str], DatabaseTypes]) -> None:
    """Where each database's types come from (a SQLAlchemy dialect name → its types)."""
    global _database_types
    _database_types = provider
    for_dialect_name.cache_clear()


@functools.cache
def for_dialect_name(name: str) -> DatabaseTypes:
    if _database_types is None:
        raise ConfigurationError(
            "dbqueue's schema was imported without its package: import dbqueue.schema (or any "
            "dbqueue module), not the file on its own"
        )
    return _database_types(name)


def for_dialect(dialect: Any) -> DatabaseTypes:
    """The types of a SQLAlchemy dialect's database."""
    return for_dialect_name(dialect.name)


class Payload(sa.types.TypeDecorator):
    """The payload column: each database's native JSON type where it has one, else text."""

    impl = JsonText
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        native = for_dialect(dialect).payload
        return dialect.type_descriptor(native if native is not None else JsonText())


class UtcDateTime(sa.types.TypeDecorator):
    """Timestamps are UTC everywhere; Python sees timezone-aware datetimes."""

    impl = sa.DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        native = for_dialect(dialect).timestamp
        return dialect.type_descriptor(native if native is not None else sa.DateTime())

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(
                f"naive datetime {value!r}: pass a timezone-aware datetime "
                "(e.g. datetime.now(timezone.utc))"
            )
        return value.astimezone(dt.timezone.utc)

    def result_processor(self, dialect: Any, coltype: Any) -> Any:
        # A claim reads five timestamps per job: let the common case (the driver already gave
        # an aware UTC datetime) through without the decorator's two calls per value.
        convert = super().result_processor(dialect, coltype)
        if convert is None:
            return None
        utc, datetime = dt.timezone.utc, dt.datetime
        parse = datetime.fromisoformat

        def process(value: Any) -> Any:
            if value is None or (type(value) is datetime and value.tzinfo is utc):
                return value
            if type(value) is str:
                # SQLite's text, UTC without an offset: what the chain below makes of it (the
                # driver's type parses it with fromisoformat, then UTC is attached) in one call
                # instead of four, and without datetime.replace, which costs ten parses. A value
                # with an offset of its own, or none at all, takes the chain, which decides.
                try:
                    parsed = parse(value + "+00:00")
                except ValueError:
                    parsed = None
                if parsed is not None and parsed.tzinfo is utc:  # not a bare date, say
                    return parsed
            return convert(value)

        return process

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):  # a hand-written SQLite value SQLAlchemy did not parse
            value = dt.datetime.fromisoformat(value)
        tzinfo = value.tzinfo
        if tzinfo is dt.timezone.utc:  # what drivers return for a UTC session: the common case
            return value
        if tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)

"""PostgreSQL ≥ 12: SKIP LOCKED claims, advisory locks, LISTEN/NOTIFY wake-ups."""

from __future__ import annotations

import hashlib
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine
from sqlalchemy.sql.elements import ColumnElement

from ..sqltypes import NativeJson
from ..wakeup import Notifier
from .base import Dialect, driver_code, seconds_expression
from .pg_listen import PgNotifier

_UNDEFINED_TABLE = "42P01"
_TRANSIENT = {"40001", "40P01", "55P03"}  # serialization failure, deadlock, lock not available


def lock_key(name: str) -> int:
    """Advisory locks take a bigint: the name's 64-bit hash.

    A collision can only make a lock look taken when it is not (a job waits a round longer),
    never let two holders share one.
    """
    return int.from_bytes(
        hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True
    )


class PostgresDialect(Dialect):
    name = "postgresql"
    sqlalchemy_names = ("postgresql",)
    url_driver = "postgresql+psycopg2"
    default_port = 5432
    default_strategy = "skip_locked"

    supports_skip_locked = True
    supports_named_locks = True
    supports_listen_notify = True

    def now(self) -> ColumnElement:
        # statement_timestamp(), not now(): now() is frozen at the start of the transaction, and
        # a batch transaction lives for as long as its handlers run.
        return sa.func.statement_timestamp()

    def now_plus(self, seconds: float | ColumnElement) -> ColumnElement:
        return self.now() + sa.func.make_interval(0, 0, 0, 0, 0, 0, seconds_expression(seconds))

    def try_lock(self, name: str) -> ColumnElement:
        return sa.func.pg_try_advisory_lock(sa.literal(lock_key(name), sa.BigInteger()))

    def unlock(self, name: str) -> ColumnElement:
        return sa.func.pg_advisory_unlock(sa.literal(lock_key(name), sa.BigInteger()))

    def notifier(self, engine: Engine, channel: str) -> Notifier:
        return PgNotifier(engine, channel)

    @classmethod
    def json_type(cls) -> sa.types.TypeEngine:
        return NativeJson("JSONB", driver_decodes=True)

    @classmethod
    def timestamp_type(cls) -> sa.types.TypeEngine:
        return postgresql.TIMESTAMP(timezone=True)

    @classmethod
    def server_now_default(cls) -> Any:
        return sa.func.now()

    def is_missing_table(self, exc: BaseException) -> bool:
        return driver_code(exc) == _UNDEFINED_TABLE

    def is_transient(self, exc: BaseException) -> bool:
        return driver_code(exc) in _TRANSIENT

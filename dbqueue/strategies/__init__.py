"""Internal: how a claim is made exclusive (one module per strategy), and the choice of one by
name or by the database."""

from __future__ import annotations

from dbqueue.config import Settings
from dbqueue.dialects import Dialect
from dbqueue.errors import ConfigurationError
from dbqueue.strategies.advisory_lock import AdvisoryLockStrategy
from dbqueue.strategies.base import ClaimStrategy
from dbqueue.strategies.lock_server import LockServerStrategy
from dbqueue.strategies.skip_locked import SkipLockedStrategy
from dbqueue.strategies.sqlite import SQLiteStrategy

STRATEGIES: dict[str, type[ClaimStrategy]] = {
    cls.name: cls
    for cls in (SkipLockedStrategy, AdvisoryLockStrategy, LockServerStrategy, SQLiteStrategy)
}
STRATEGY_NAMES = tuple(STRATEGIES)


def resolve(name: str | None, dialect: Dialect | type[Dialect]) -> type[ClaimStrategy]:
    """The strategy called ``name``, else the database's own."""
    name = name or dialect.default_strategy
    try:
        return STRATEGIES[name].for_dialect(dialect)
    except KeyError:
        available = ", ".join(sorted(STRATEGIES))
        raise ConfigurationError(
            f"unknown claim strategy {name!r}: choose one of {available}"
        ) from None


def create(name: str | None, dialect: Dialect, settings: Settings | None = None) -> ClaimStrategy:
    """The strategy called ``name`` (default: the database's own), checked against the server."""
    return resolve(name, dialect)(dialect, settings)


__all__ = ["ClaimStrategy", "STRATEGIES", "STRATEGY_NAMES", "create", "resolve"]

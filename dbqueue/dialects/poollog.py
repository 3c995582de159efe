"""One line, not a traceback, when a connection cannot be reset because the database went away.

SQLAlchemy's pool logs a failed reset-on-return (the ROLLBACK of a connection handed back while
the server restarts) at ERROR with the whole traceback. For dbqueue that is an expected event of
a database restart, which the worker already reports and recovers from; the pool discards the
connection either way. Only records carrying a driver error are shortened; everything else the
pool logs passes unchanged.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa


class _ResetFailureFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and isinstance(exc, (sa.exc.DBAPIError, *_driver_errors())):
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            record.msg = "a pooled connection could not be reset (%s); the pool discards it"
            record.args = (text,)
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_FILTER = _ResetFailureFilter()


def _driver_errors() -> tuple[type[BaseException], ...]:
    """The DB-API error classes of the installed drivers (a reset error is a raw driver one)."""
    found: list[type[BaseException]] = []
    for module in ("psycopg2", "pymysql", "sqlite3", "singlestoredb"):
        try:
            found.append(__import__(module).Error)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def quiet_reset_failures(engine: sa.Engine) -> None:
    """Shorten the pool's reset-failure records for this engine's pool class."""
    logger = logging.getLogger(f"sqlalchemy.pool.impl.{type(engine.pool).__name__}")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)

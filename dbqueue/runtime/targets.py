"""Where a call writes: the caller's ORM Session (or a ``scoped_session`` such as Flask-SQLAlchemy's
``db.session``) or Connection, whose transaction the job joins, or an Engine, in which case
dbqueue opens and commits a short transaction of its own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session, scoped_session

from dbqueue import dialects

#: Where jobs are written. A ``scoped_session`` (Flask-SQLAlchemy's ``db.session``) stands for
#: the Session it holds for the current scope (thread, request, app context).
Target = Session | Connection | Engine | scoped_session[Any]


def write_target(target: Target) -> Target:
    """For statements that read and then write: dbqueue's own transaction takes its write
    lock first where the database locks whole (SQLite)."""
    if isinstance(target, Engine):
        return target.execution_options(**{dialects.WRITE_INTENT: True})
    return target


def current_session(target: Any) -> Any:
    """The Session a ``scoped_session`` proxies for the current scope; any other target as is."""
    return target() if isinstance(target, scoped_session) else target


@contextlib.contextmanager
def connection_for(target: Any) -> Iterator[Connection]:
    """A Connection inside the caller's transaction (or a fresh one for an Engine)."""
    target = current_session(target)
    if isinstance(target, Session):
        yield target.connection()
    elif isinstance(target, Connection):
        yield target
    elif isinstance(target, Engine):
        with target.begin() as conn:
            yield conn
    elif type(target).__module__.startswith("sqlalchemy.ext.asyncio"):
        raise TypeError(
            f"cannot enqueue through an {type(target).__name__} synchronously: await the async "
            "call (app.aenqueue, app.aenqueue_many, app.apublish) with it"
        )
    else:
        raise TypeError(
            f"cannot enqueue through {type(target).__name__}: pass a SQLAlchemy ORM Session (or "
            "a scoped_session such as Flask-SQLAlchemy's db.session) or Connection (the job "
            "joins its transaction) or an Engine (dbqueue commits at once)"
        )

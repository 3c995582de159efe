"""Eager mode (``App(eager=True)`` / ``DBQUEUE_EAGER=true``): the jobs an enqueue writes run in
this process as soon as the transaction that holds them commits — at once when dbqueue made that
transaction itself (target None or an Engine) — and not at all if it rolls back.

The hook here only decides *when*: after an ORM Session's outermost commit (its
``after_transaction_end``, once the commit is complete and the connection released), or in a
Connection's ``commit`` event. SQLAlchemy Core signals a Connection's commit only just before
it happens, so there the DBAPI transaction is committed first, in that event, and the COMMIT
SQLAlchemy then sends finds nothing left to do. A Session bound to a Connection commits with
that Connection, so it is followed there.

*How* the jobs run is the worker's business (claim by id with the queue's strategy, the worker's
executor, retries, dead-letter jobs): ``dbqueue.worker.eager.EagerRunner``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session, SessionTransaction

from dbqueue.errors import ConfigurationError, EagerJobError
from dbqueue.runtime.targets import Target, current_session
from dbqueue.worker.eager import EagerRunner

if TYPE_CHECKING:
    from dbqueue.runtime.commit_wake import CommitWaker
    from dbqueue.runtime.context import RuntimeContext


def check_flag(name: str, value: Any) -> bool | None:
    """An on/off option: True, False or None (unset)."""
    if value is not None and not isinstance(value, bool):
        raise ConfigurationError(f"{name}={value!r} must be True or False")
    return value


class AfterCommit:
    """What follows the jobs an enqueue wrote, once its transaction commits: the workers are
    woken (here and through the lock server) and, in eager mode, the jobs run in this process."""

    def __init__(self, context: RuntimeContext, waker: CommitWaker) -> None:
        self.context = context
        self._waker = waker
        self._lock = threading.Lock()
        self._eager_hook: EagerHook | None = None

    @property
    def eager(self) -> bool:
        """Whether jobs run in this process when their enqueue commits (eager mode)."""
        return self.context.settings.eager

    def enqueued(self, target: Target | None, queues: Sequence[str], ids: Sequence[int]) -> None:
        """Jobs were just written through ``target``: once that commits, wake the workers (and
        the lock server) for ``queues``; in eager mode, run the jobs."""
        self._waker.after_commit(target, queues)
        if ids and self.context.settings.eager:
            self._hook().after_commit(target, ids)

    def _hook(self) -> EagerHook:
        """Built on the first eager enqueue: an App that never runs jobs here needs no runner."""
        with self._lock:
            if self._eager_hook is None:
                self._eager_hook = EagerHook(self.context, EagerRunner(self.context))
            return self._eager_hook


@dataclass
class _Pending:
    """The jobs a Session's current outermost transaction enqueued."""

    ids: list[int] = field(default_factory=list)
    committed: bool = False


class EagerHook:
    """Runs jobs when the transaction that enqueued them commits; forgets them on rollback."""

    def __init__(self, context: RuntimeContext, runner: Any) -> None:
        self.context = context
        self.runner = runner
        self._key = f"dbqueue_eager_{id(self)}"
        self._lock = threading.Lock()
        self._connections: weakref.WeakKeyDictionary[Connection, list[int]] = (
            weakref.WeakKeyDictionary()
        )
        self._hooked: weakref.WeakSet[Connection] = weakref.WeakSet()

    def after_commit(self, target: Target | None, ids: Sequence[int]) -> None:
        target = current_session(target)
        if target is None or isinstance(target, Engine):
            self.run(ids)  # dbqueue's own transaction has committed
        elif isinstance(target, Session):
            if isinstance(target.bind, Connection):
                self._on_connection(target.bind, ids)
            else:
                self._on_session(target, ids)
        elif isinstance(target, Connection):
            self._on_connection(target, ids)

    def run(self, ids: Sequence[int]) -> None:
        failures = self.runner.run(ids)
        if failures and self.context.settings.eager_raise:
            raise EagerJobError(_describe(failures), failures)

    # ---- an ORM Session -----------------------------------------------------------------------
    def _on_session(self, session: Session, ids: Sequence[int]) -> None:
        with self._lock:
            pending = session.info.get(self._key)
            if pending is None:
                pending = session.info[self._key] = _Pending()
                sa.event.listen(session, "after_commit", self._session_committed)
                sa.event.listen(session, "after_transaction_end", self._session_ended)
        pending.ids.extend(ids)

    def _session_committed(self, session: Session) -> None:
        pending = session.info.get(self._key)
        if pending is not None and not session.in_nested_transaction():  # not a SAVEPOINT's
            pending.committed = True

    def _session_ended(self, session: Session, transaction: SessionTransaction) -> None:
        pending = session.info.get(self._key)
        if transaction.parent is not None or pending is None:
            return
        ids, committed = pending.ids, pending.committed
        pending.ids, pending.committed = [], False
        if ids and committed:  # a rollback forgets them: the jobs are gone
            self.run(ids)

    # ---- a Core Connection --------------------------------------------------------------------
    def _on_connection(self, conn: Connection, ids: Sequence[int]) -> None:
        with self._lock:
            pending = self._connections.setdefault(conn, [])
            if conn not in self._hooked:
                self._hooked.add(conn)
                sa.event.listen(conn, "commit", self._connection_committing)
                sa.event.listen(conn, "rollback", self._connection_rolled_back)
        pending.extend(ids)

    def _connection_committing(self, conn: Connection) -> None:
        with self._lock:
            ids = self._connections.pop(conn, None)
        if ids:
            _commit_first(conn)
            self.run(ids)

    def _connection_rolled_back(self, conn: Connection) -> None:
        with self._lock:
            self._connections.pop(conn, None)


def _commit_first(conn: Connection) -> None:
    """Commit the DBAPI transaction now, inside SQLAlchemy's ``commit`` event (which comes just
    before its own COMMIT, which then has nothing to do): the jobs must be visible to the
    connection that runs them. A failure is the commit's, raised as SQLAlchemy would."""
    dbapi = conn.dialect.loaded_dbapi
    try:
        conn.dialect.do_commit(conn.connection)
    except dbapi.Error as exc:
        raise sa.exc.DBAPIError.instance(
            None, None, exc, dbapi.Error, dialect=conn.dialect
        ) from exc


def _describe(failures: list[dict[str, Any]]) -> str:
    """One line per failure's summary, then the first failure's recorded message."""
    first = failures[0]
    message = str(first.get("message") or "")
    if first["status"] == "dead":
        what = f"is dead after {first['attempt']} attempt(s)"
    else:
        what = "was not run (left for a worker)"
    summary = message.splitlines()[0] if message else "no message"
    head = f"eager mode: job {first['id']} ({first['task']}) {what}: {summary}"
    if len(failures) > 1:
        others = ", ".join(str(f["id"]) for f in failures[1:])
        head += f" (and {len(failures) - 1} more: job(s) {others})"
    return f"{head}\n{message}" if "\n" in message else head

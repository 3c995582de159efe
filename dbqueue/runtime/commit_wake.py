"""Waking workers once an enqueue commits: this process's workers directly, others through the
lock server (a hint that never blocks). Not before the commit: a worker woken early would look
for a job it cannot see yet."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from dbqueue import lockserver
from dbqueue.lockserver import client as lockserver_client
from dbqueue.runtime.targets import Target, current_session

if TYPE_CHECKING:
    from dbqueue.lockserver.client import LockServerClient
    from dbqueue.runtime.context import RuntimeContext


class CommitWaker:
    def __init__(self, context: RuntimeContext) -> None:
        self.context = context
        self._lock = threading.Lock()
        #: Where enqueues hint the lock server (None: not decided yet; False: no lock server).
        self._hint_client: LockServerClient | bool | None = None
        #: Connections whose commit will wake workers, with the queues their enqueues used.
        self._connections_to_wake: weakref.WeakKeyDictionary[Connection, set[str]] = (
            weakref.WeakKeyDictionary()
        )
        #: Connections whose commits this waker listens to.
        self._hooked: weakref.WeakSet[Connection] = weakref.WeakSet()

    def after_commit(self, target: Target | None, queues: Sequence[str]) -> None:
        hints = self._hints()
        if not self.context.local_workers and hints is None:
            return
        target = current_session(target)
        if isinstance(target, Session) and isinstance(target.bind, Connection):
            # Joined to a Connection's transaction (a handler's session among them): its own
            # commit only releases a savepoint; the Connection's is the one that counts.
            target = target.bind
        if target is None or isinstance(target, Engine):
            self._wake(hints, sorted(set(queues)))  # dbqueue's own transaction has committed
        elif isinstance(target, Session):
            pending = target.info.setdefault("dbqueue_wake", set())
            if not pending:
                sa.event.listen(target, "after_commit", self._wake_session, once=True)
            pending.update(queues)
        elif isinstance(target, Connection):
            # Core has no after-commit event: "commit" fires just before it. The workers are
            # told the wake is early, and look again a few times soon after. One listener per
            # connection, for its life (a worker's serves every job its handlers enqueue from):
            # a commit wakes them when its transaction enqueued something.
            with self._lock:
                pending = self._connections_to_wake.get(target)
                if pending is None:
                    pending = self._connections_to_wake[target] = set()
                    if target not in self._hooked:
                        self._hooked.add(target)
                        sa.event.listen(target, "commit", self._wake_connection)
                pending.update(queues)

    def _wake(
        self, hints: LockServerClient | None, queues: Sequence[str], early: bool = False
    ) -> None:
        self.context.local_workers.wake(early)
        if hints is not None:
            hints.hint(queues)  # never blocks: dropped or kept for later without a connection

    def _wake_connection(self, conn: Connection) -> None:
        with self._lock:
            pending = self._connections_to_wake.pop(conn, None)
        if pending is not None:
            self._wake(self._hints(), sorted(pending), early=True)

    def _wake_session(self, session: Session) -> None:
        self._wake(self._hints(), sorted(session.info.pop("dbqueue_wake", set())))

    def lock_server_client(self) -> LockServerClient | None:
        """The lock server connection this App's enqueues hint (None: it knows none), which
        callers waiting for jobs also subscribe through."""
        return self._hints()

    def _hints(self) -> LockServerClient | None:
        """The lock server connection enqueues hint, when this queue's jobs are claimed
        through one."""
        if self._hint_client is None:
            with self._lock:
                if self._hint_client is None:
                    self._hint_client = self._connect_hints() or False
        return self._hint_client or None

    def _connect_hints(self) -> LockServerClient | None:
        if not self.context.hints_lock_server():
            return None
        settings = self.context.settings
        return lockserver_client.connect(
            lockserver.notify_address(settings),
            token=settings.lock_server_token,
            timeout=lockserver.message_timeout(settings),
        )

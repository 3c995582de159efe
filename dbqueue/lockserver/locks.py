"""Named locks held on the lock server: the lock_server strategy's claims and maintenance locks.

Locks are owned by (connection, owner), the owner being the thread that took them: the worker
threads, the maintenance thread and any other user in the process share one connection, and a
lock taken by one thread is neither re-entrant for it nor releasable by another. This process
remembers what it holds so that, after the connection comes back (the server restarted, the
network hiccuped), it can try to take those locks again before doing anything else; whether that
worked is asked again, with ``holding()``, before any job's outcome commits.

Before an outcome commits, ``ask_holding()`` needs no message while the connection the locks
were taken on is still up: the server frees a lock only when its owner releases it or its
connection ends. Should the server have ended the connection unnoticed yet, the outcome's
UPDATE is fenced in the database anyway (``status = 'running'`` under this worker's id), which
is what stops a job another worker took over; the lock server's answer adds nothing to that.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

from sqlalchemy.engine import Connection

from dbqueue.errors import DbqueueError
from dbqueue.lockserver import protocol
from dbqueue.lockserver.client import LockServerClient, Send
from dbqueue.strategies.locks import LockBackend

#: Set in an async worker's slot (all of which share the event loop's thread): the slot's own
#: thread id, which owns its locks, and asks that requests be awaited on the loop, not waited for.
ASYNC_OWNER: ContextVar[int | None] = ContextVar("dbqueue_lock_owner", default=None)


def _owner(thread_id: int | None = None) -> str:
    if thread_id is None:
        thread_id = ASYNC_OWNER.get() or threading.get_ident()
    return f"{os.getpid()}:{thread_id}"


def _chunks(names: Sequence[str]) -> list[list[str]]:
    size = protocol.MAX_NAMES
    return [list(names[i : i + size]) for i in range(0, len(names), size)]


class LockServerLocks(LockBackend):
    def __init__(self, client: LockServerClient) -> None:
        self.client = client
        self._held: dict[str, str] = {}  # name → owner: what this process believes it holds
        #: name → the connection (``connection_number()``) it was taken on; -1: not known.
        self._taken_on: dict[str, int] = {}
        self._lock = threading.Lock()
        client.add_connect_hook(self._reclaim)

    def try_acquire(self, conn: Connection | None, names: Sequence[str]) -> list[bool]:
        owner = _owner()
        taken: list[bool] = []
        for chunk in _chunks(names):
            connection = self.client.connection_number()
            reply = self._request("acquire", names=chunk, owner=owner)
            got = [bool(t) for t in reply.get("taken", [])]
            if len(got) != len(chunk):
                raise ValueError(f"the lock server answered {len(got)} of {len(chunk)} locks")
            if connection is None or self.client.connection_number() != connection:
                connection = -1  # the request may have gone out on another connection
            with self._lock:
                for name, ok in zip(chunk, got, strict=True):
                    if ok:
                        self._held[name] = owner
                        self._taken_on[name] = connection
            taken += got
        return taken

    def release(self, conn: Connection | None, names: Sequence[str]) -> None:
        """Fire and forget: the reply is not needed, and with no connection the server has
        already dropped these locks."""
        self._release(_owner(), names)

    def release_for_thread(self, thread_id: int, names: Sequence[str]) -> None:
        self._release(_owner(thread_id), names)

    def _release(self, owner: str, names: Sequence[str]) -> None:
        with self._lock:
            mine = [name for name in names if self._held.get(name) == owner]
            for name in mine:
                del self._held[name]
                self._taken_on.pop(name, None)
        for chunk in _chunks(mine):
            self.client.send("release", names=chunk, owner=owner)

    def holding(self, conn: Connection | None, names: Sequence[str]) -> bool:
        owner = _owner()
        for chunk in _chunks(names):
            if not all(self._request("holding", names=chunk, owner=owner).get("held", [])):
                return False
        return True

    def ask_holding(self, names: Sequence[str]) -> Callable[[Connection], bool]:
        """No question while the connection the locks were taken on is up (see the module's
        docstring); else it is sent now, and its answer read when wanted: the outcome's UPDATE
        runs while it travels. (An async slot asks when the answer is wanted.)"""
        owner = _owner()
        if self._held_on_this_connection(names, owner):
            return lambda conn: (
                self._held_on_this_connection(names, owner) or self.holding(conn, names)
            )
        if ASYNC_OWNER.get() is not None:
            return lambda conn: self.holding(conn, names)
        try:
            replies = [
                self.client.request_later("holding", names=chunk, owner=owner)
                for chunk in _chunks(names)
            ]
        except DbqueueError:  # no server now: asked again when wanted, after the fenced UPDATE
            return lambda conn: self.holding(conn, names)
        return lambda conn: all(all(reply().get("held", [])) for reply in replies)

    def _held_on_this_connection(self, names: Sequence[str], owner: str) -> bool:
        """Whether ``owner`` took every one of ``names`` on the connection up now."""
        connection = self.client.connection_number()
        if connection is None:
            return False
        with self._lock:
            return all(
                self._held.get(name) == owner and self._taken_on.get(name) == connection
                for name in names
            )

    def _request(self, op: str, **fields: Any) -> dict[str, Any]:
        """A request and its reply: awaited on the loop from an async slot's greenlet (the
        claim code is the same), waited for in a thread."""
        if ASYNC_OWNER.get() is None:
            return self.client.request(op, **fields)
        from sqlalchemy import util

        wait = getattr(util, "await_", None) or util.await_only
        return wait(self.client.request_async(op, **fields))  # type: ignore[no-any-return]

    def close(self) -> None:
        self.client.remove_connect_hook(self._reclaim)

    def _reclaim(self, send: Send) -> None:
        """After a reconnect: take back, under the same owners, the locks still held here.

        Sent without waiting (this runs on the connection's thread, before other requests);
        a lock another client took meanwhile stays theirs, and ``holding()`` will say so.
        """
        with self._lock:
            by_owner: dict[str, list[str]] = {}
            for name, owner in self._held.items():
                by_owner.setdefault(owner, []).append(name)
        for owner, names in by_owner.items():
            for chunk in _chunks(names):
                send({"op": "acquire", "names": chunk, "owner": owner})

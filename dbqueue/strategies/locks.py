"""Named locks: the liveness token of claimed jobs and the leader election of maintenance.

A lock belongs to one connection (or lock-server client) and dies with it, so a crashed worker
frees its jobs and its maintenance routines at once. Here: their names and the interface;
the backends are the database's own advisory locks (``DatabaseLocks`` in ``advisory_lock.py``:
PostgreSQL pg_try_advisory_lock, MySQL/MariaDB GET_LOCK) and the lock server's
(``dbqueue/lockserver/locks.py``).
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection


def job_lock_name(jobs_table: str, job_id: int) -> str:
    return f"{job_lock_prefix(jobs_table)}{job_id}"


def job_lock_prefix(jobs_table: str) -> str:
    return f"{jobs_table}:job:"


def routine_lock_name(jobs_table: str, routine: str) -> str:
    return f"{jobs_table}:routine:{routine}"


#: The lock server takes names of up to 200 characters; a longer slot name becomes a hash.
_MAX_SLOT_NAME = 200


def slot_lock_name(jobs_table: str, queue: str, slot: int) -> str:
    """The named lock that holds slot ``slot`` of a limited queue (lock-based strategies)."""
    name = f"{jobs_table}:slot:{queue}:{slot}"
    if len(name) <= _MAX_SLOT_NAME:
        return name
    digest = hashlib.blake2b(f"{queue}:{slot}".encode(), digest_size=16).hexdigest()
    return f"{jobs_table}:slot:{digest}"


class LockBackend(abc.ABC):
    """Non-blocking, owner-scoped named locks."""

    #: Whether a release is a statement on the caller's connection (cheap inside its open
    #: transaction), rather than a message elsewhere.
    releases_in_transaction: bool = False

    @abc.abstractmethod
    def try_acquire(self, conn: Connection, names: Sequence[str]) -> list[bool]:
        """Try each lock without waiting; one round trip for all of them."""

    @abc.abstractmethod
    def release(self, conn: Connection, names: Sequence[str]) -> None:
        """Release locks this owner holds."""

    def release_for_thread(self, thread_id: int, names: Sequence[str]) -> None:  # noqa: B027
        """Release locks another thread of this process took (one the watchdog abandoned).
        Database locks need nothing: they died with the connection the watchdog ended."""

    def try_acquire_named_by(
        self, prefix: str
    ) -> Callable[[sa.ColumnElement], sa.ColumnElement] | None:
        """key → an expression taking, in the statement that reads the key, the lock named
        ``prefix`` + key; None if these locks cannot be taken in SQL (read, then try_acquire)."""
        return None

    def release_statement(self, prefix: str) -> sa.Select | None:
        """A statement releasing, on its connection, the locks named ``prefix`` + key for each
        key of its array parameter ``keys`` (a batch's jobs); None: ``release`` them."""
        return None

    def holding(self, conn: Connection, names: Sequence[str]) -> bool:
        """Whether this owner still holds every one of ``names`` (checked just before a job's
        outcome commits). Database locks belong to the session that commits, so they cannot
        be lost while the transaction survives: always True here."""
        return True

    def ask_holding(self, names: Sequence[str]) -> Callable[[Connection], bool]:
        """``holding``, asked now and answered by the call returned (a question that travels
        elsewhere travels meanwhile)."""
        return lambda conn: self.holding(conn, names)

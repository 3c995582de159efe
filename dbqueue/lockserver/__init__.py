"""Internal: the lock server (``dbqueue server``), the seed's client-server mode, for databases
without SKIP LOCKED or named locks (SingleStore) and for push wake-ups on databases that cannot
push (MySQL, SQLite).

``dbqueue server`` (``server.py``) holds connection-scoped named locks in memory and pushes
"work available" to idle workers; workers reach it through one shared connection per process
(``client.py``), take their claims' locks there (``locks.py``, used by the ``lock_server``
strategy) and receive wake-ups (``notifier.py``). Jobs never leave the database.
"""

from __future__ import annotations

from dbqueue.config import Settings
from dbqueue.lockserver.protocol import (
    DEFAULT_LOCK_PORT,
    DEFAULT_MESSAGE_TIMEOUT,
    DEFAULT_NOTIFY_PORT,
    Address,
    parse_address,
)

DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_LOCK_PORT}"


def lock_address(settings: Settings) -> Address:
    """Where locks are taken: --server / DBQUEUE_LOCK_SERVER, else SERVER_HOST:LOCK_SERVICE_PORT,
    else 127.0.0.1:8970 (the seed's defaults)."""
    return parse_address(settings.lock_server or DEFAULT_ADDRESS, DEFAULT_LOCK_PORT)


def notify_address(settings: Settings) -> Address:
    """Where idle workers wait for pushes: the lock address when one was given explicitly, else
    SERVER_HOST:NOTIFY_SERVICE_PORT (the server serves both ports alike)."""
    text = settings.notify_server or settings.lock_server or f"127.0.0.1:{DEFAULT_NOTIFY_PORT}"
    return parse_address(text, DEFAULT_NOTIFY_PORT)


def message_timeout(settings: Settings) -> float:
    return settings.socket_timeout or DEFAULT_MESSAGE_TIMEOUT


__all__ = ["Address", "lock_address", "message_timeout", "notify_address", "parse_address"]

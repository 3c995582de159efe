"""What ``dbqueue server`` is configured with: its addresses, token, limits and timeouts."""

from __future__ import annotations

from dataclasses import dataclass

from dbqueue.lockserver import protocol


@dataclass(frozen=True)
class ServerConfig:
    """What ``dbqueue server`` is configured with (the seed's variable names in comments)."""

    bind: str = "127.0.0.1"
    port: int = protocol.DEFAULT_LOCK_PORT  # LOCK_SERVICE_PORT
    notify_port: int | None = protocol.DEFAULT_NOTIFY_PORT  # NOTIFY_SERVICE_PORT
    token: str | None = None
    max_clients: int = 50  # MAX_CLIENT_THREADS
    message_timeout: float = protocol.DEFAULT_MESSAGE_TIMEOUT  # TIMEOUT_SOCKET_MESSAGE
    idle_timeout: float = protocol.DEFAULT_IDLE_TIMEOUT  # LOCK_SERVICE_WAIT_CONN_INTERVAL
    check_interval: float = 15.0  # CHECK_TASKS_INTERVAL

"""Process-level pieces of a worker: signal handling, connection disposal, argument checks."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection

from dbqueue.errors import ConfigurationError

log = logging.getLogger("dbqueue.worker")


class SignalHandlers:
    """SIGTERM/SIGINT stop claiming and let running jobs finish (only from the main thread)."""

    def __init__(self, stop: Callable[[], None] | None) -> None:
        """``stop``: the worker's; None installs nothing."""
        self.stop = stop
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> None:
        if self.stop is None or threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.previous[signum] = signal.signal(signum, self._handle)

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        assert self.stop is not None
        log.info(
            "%s received: no new jobs will be claimed; waiting for running jobs to finish",
            signal.Signals(signum).name,
        )
        self.stop()


def discard(conn: Connection | None, broken: bool = False) -> None:
    """Close a connection; after an error also drop it from the pool, so that session state
    (advisory locks, an aborted transaction) dies with it instead of reaching another thread."""
    if conn is not None:
        try:
            if broken:
                conn.invalidate()
            conn.close()
        except Exception:  # the connection is already broken; nothing to save
            log.debug("closing a broken connection failed", exc_info=True)
    return None


def first_line(exc: BaseException | None) -> str:
    text = str(exc).strip() if exc is not None else ""
    return text.splitlines()[0] if text else type(exc).__name__


def positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name}={value!r} must be a whole number of at least 1")
    return value


def positive_seconds(name: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigurationError(f"{name}={value!r} must be a positive number of seconds")
    return float(value)

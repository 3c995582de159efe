"""Process-level pieces of a worker: signal handling, connection disposal, argument checks."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from sqlalchemy.engine import Connection

from dbqueue.errors import ConfigurationError

log = logging.getLogger("dbqueue.worker")


class SignalHandlers:
    """The first SIGTERM/SIGINT stops claiming and lets running jobs finish; the next one stops
    at once (Celery's warm, then cold, shutdown). Installed only from the main thread."""

    def __init__(
        self, stop: Callable[[bool], None] | None, shutdown_timeout: float | None = None
    ) -> None:
        """``stop(now)``: the worker's; None installs nothing. ``shutdown_timeout``: how long
        the first signal waits at most, said in its log line."""
        self.stop = stop
        self.shutdown_timeout = shutdown_timeout
        self.received = 0
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
        name = signal.Signals(signum).name
        self.received += 1
        if self.received == 1:
            limit = self.shutdown_timeout
            log.info(
                "%s received: no new jobs will be claimed; waiting for running jobs to finish%s "
                "(a second SIGINT or SIGTERM stops at once)",
                name,
                "" if limit is None else f", for at most {limit:g}s (the shutdown timeout)",
            )
            self.stop(False)
        elif self.received == 2:
            log.warning("%s received again: stopping at once", name)
            self.stop(True)
        else:
            log.info("%s received: the worker is stopping at once already", name)


def exit_now(code: int = 0) -> NoReturn:
    """End the process now, after its exit hooks (logging's flush among them), without the
    interpreter's teardown: a daemon thread still blocked in a handler may wake during that
    teardown, and one that runs a handler in a greenlet (a plain handler on an async worker's
    slot) can then crash the process. Solid Queue's immediate termination is ``exit!`` too."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


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


def seconds_or_zero(name: str, value: Any) -> Any:
    """None, or a number of seconds that may be 0 (``shutdown_timeout=0``: do not wait)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigurationError(f"{name}={value!r} must be a number of seconds, 0 or more")
    return float(value)

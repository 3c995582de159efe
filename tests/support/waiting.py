"""Waiting on events in tests: poll a condition with a deadline, never a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def wait_for(
    predicate: Callable[[], object],
    timeout: float,
    what: str,
    log: Path | None = None,
    interval: float = 0.05,
    state: Callable[[], object] | None = None,
) -> None:
    """Return once ``predicate()`` is true; fail after ``timeout`` seconds naming ``what``
    (with the end of ``log`` when given, and what ``state()`` shows then: a flaky wait is
    diagnosed from its one failure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    tail = f"\n--- log ---\n{log.read_text()[-4000:]}" if log and log.exists() else ""
    shown = f"\n--- state ---\n{state()!r}" if state is not None else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{shown}{tail}")

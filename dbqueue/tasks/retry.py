"""When a failed job runs again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

#: A backoff maps the number of the attempt that just failed (1, 2, …) to seconds to wait.
Backoff = Callable[[int], float]

DEFAULT_BASE_INTERVAL = 300.0  # the seed's QUEUE_BASE_INTERVAL_RETRY: 5 minutes


def linear_backoff(base_interval: float = DEFAULT_BASE_INTERVAL) -> Backoff:
    """The seed's rule: base interval × attempt number."""

    def backoff(attempt: int) -> float:
        return base_interval * attempt

    backoff.__qualname__ = f"linear_backoff({base_interval})"
    return backoff


class _BackoffRule:
    """The retry delay a failed attempt gets unless its handler asked for another."""

    def __repr__(self) -> str:
        return "BACKOFF"


#: "Retry after the backoff rule": what a failure asks for unless its handler raised Discard
#: (None: dead now) or Retry (a number of seconds).
BACKOFF: Final = _BackoffRule()
Requested = float | None | _BackoffRule


def retry_delay(
    attempt: int, max_attempts: int, backoff: Backoff, requested: Requested = BACKOFF
) -> float | None:
    """Seconds until the next attempt, or None when the job is dead: attempts are exhausted, or
    its handler discarded it (``requested`` None). ``requested`` seconds replace the backoff."""
    if requested is None or attempt >= max_attempts:
        return None
    if isinstance(requested, _BackoffRule):
        return max(0.0, float(backoff(attempt)))
    return requested

"""When a failed job runs again."""

from __future__ import annotations

from collections.abc import Callable

#: A backoff maps the number of the attempt that just failed (1, 2, …) to seconds to wait.
Backoff = Callable[[int], float]

DEFAULT_BASE_INTERVAL = 300.0  # the seed's QUEUE_BASE_INTERVAL_RETRY: 5 minutes


def linear_backoff(base_interval: float = DEFAULT_BASE_INTERVAL) -> Backoff:
    """The seed's rule: base interval × attempt number."""

    def backoff(attempt: int) -> float:
        return base_interval * attempt

    backoff.__qualname__ = f"linear_backoff({base_interval})"
    return backoff


def retry_delay(attempt: int, max_attempts: int, backoff: Backoff) -> float | None:
    """Seconds until the next attempt, or None when attempts are exhausted (the job is dead)."""
    if attempt >= max_attempts:
        return None
    return max(0.0, float(backoff(attempt)))

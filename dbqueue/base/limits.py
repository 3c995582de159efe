"""Queue limits: how many jobs of one queue may run at once across all workers (the values).

``app.queue("reports", concurrency=1)`` and ``dbqueue worker --queue-limit reports=1`` give a
queue N slots; a job of the queue runs only while holding one (the strategies take them, the
worker asks). This module only checks and parses the values, for the App and the CLI alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dbqueue.base.identifiers import check_queue_name
from dbqueue.errors import ConfigurationError

#: A limit is a number of slot rows (and, for lock-based strategies, of locks a claim may try):
#: past this a queue is better left unlimited.
MAX_QUEUE_LIMIT = 1000


def check_queue_limit(queue: str, value: Any, given_as: str | None = None) -> int:
    """A limit is a whole number from 1 to MAX_QUEUE_LIMIT; ``given_as`` is how the user wrote
    it (default: ``app.queue``'s ``concurrency=N``), for the message."""
    check_queue_name(queue)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_QUEUE_LIMIT:
        given_as = given_as or f"app.queue({queue!r}, concurrency={value!r})"
        raise ConfigurationError(
            f"{given_as}: the limit must be a whole number from 1 to "
            f"{MAX_QUEUE_LIMIT} (1 makes the queue exclusive: one job at a time across all "
            "workers); leave it out for no limit"
        )
    return value


def check_queue_limits(limits: Mapping[str, Any]) -> dict[str, int]:
    """A worker's ``queue_limits``: queue name → limit."""
    if not isinstance(limits, Mapping):
        raise ConfigurationError(
            f"queue_limits must map queue names to limits, e.g. {{'reports': 1}}, "
            f"not {type(limits).__name__}"
        )
    return {
        queue: check_queue_limit(queue, value, f"queue_limits[{queue!r}]={value!r}")
        for queue, value in limits.items()
    }


def parse_queue_limits(specs: Iterable[str], option: str = "--queue-limit") -> dict[str, int]:
    """``["reports=1", "exports=3"]`` → ``{"reports": 1, "exports": 3}`` (the CLI's form)."""
    limits: dict[str, int] = {}
    for spec in specs:
        queue, sep, number = spec.partition("=")
        queue, number = queue.strip(), number.strip()
        if not sep or not queue or not number.isdigit():
            raise ConfigurationError(
                f"{option} {spec!r}: expected QUEUE=N with N a whole number, "
                f"e.g. {option} reports=1"
            )
        if queue in limits:
            raise ConfigurationError(f"{option} names queue {queue!r} twice: give it once")
        limits[queue] = check_queue_limit(queue, int(number), f"{option} {spec}")
    return limits

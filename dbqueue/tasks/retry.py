"""When a failed job runs again, or dies: the backoff rules, and the retry policy that decides a
failed attempt's fate (``RetryPolicy.failure``) for every place that records one: the worker's
executor (a handler raised, timed out or was abandoned) and the rescue routine (the job's
worker died)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

from dbqueue.config import SEED_BASE_INTERVAL
from dbqueue.errors import ConfigurationError
from dbqueue.job import Job
from dbqueue.tasks.failures import AttemptError
from dbqueue.tasks.registry import EXCLUSIVE, Backoff, TaskRegistry

#: Attempts a job gets when neither its enqueue, its task nor the App says: Oban's 20, so a
#: broken job is dead within about a week of the default backoff instead of retried for weeks.
DEFAULT_MAX_ATTEMPTS = 20
#: ``linear_backoff``'s default base interval: the seed's 5 minutes (QUEUE_BASE_INTERVAL_RETRY).
DEFAULT_BASE_INTERVAL = SEED_BASE_INTERVAL
#: The longest wait the default backoff gives (before jitter): two days.
DEFAULT_MAX_DELAY = 2 * 24 * 3600.0


def linear_backoff(base_interval: float = DEFAULT_BASE_INTERVAL) -> Backoff:
    """The seed's rule: base interval × attempt number."""

    def backoff(attempt: int) -> float:
        return base_interval * attempt

    backoff.__qualname__ = f"linear_backoff({base_interval})"
    return backoff


def polynomial_backoff(
    base: float = 15.0,
    power: float = 4,
    jitter: float = 0.1,
    max_delay: float = DEFAULT_MAX_DELAY,
) -> Backoff:
    """``base + attempt ** power`` seconds, at most ``max_delay``, plus up to ``jitter`` times
    that at random, so jobs that failed together do not all come back at the same instant.

    The default (the App's) is Sidekiq's curve, the one River uses and Oban documents:
    16 s, 31 s, 96 s, 4.5 min, 10.7 min … 1.5 days after the 19th attempt."""
    if base < 0 or power <= 0 or jitter < 0 or max_delay < 0:
        raise ConfigurationError(
            f"polynomial_backoff(base={base!r}, power={power!r}, jitter={jitter!r}, "
            f"max_delay={max_delay!r}): give base, jitter and max_delay >= 0 and power > 0"
        )

    def backoff(attempt: int) -> float:
        try:
            delay = min(base + float(attempt) ** power, max_delay)
        except OverflowError:  # a huge attempt number: the cap
            delay = max_delay
        return delay * (1.0 + jitter * random.random())

    backoff.__qualname__ = f"polynomial_backoff({base}, {power}, {jitter}, {max_delay})"
    return backoff


#: The App's backoff unless it is given one (or a base interval, the seed's linear rule).
DEFAULT_BACKOFF: Final = polynomial_backoff()


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


@dataclass(frozen=True)
class Failure:
    """A failed attempt and what it leads to: a retry ``retry_in`` seconds from now (None: the
    job is dead), a dead-letter job for its dead handler, and for a keyed job of an
    ``exclusive`` task, the back of its key's line."""

    message: str
    retry_in: float | None
    dead_letter: bool = False
    exclusive_key: bool = False
    #: What the job's list of errors records of this attempt (None: ``message`` alone).
    error: AttemptError | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """The registry's per-task backoff and dead handlers, else the App's default backoff."""

    registry: TaskRegistry
    default_backoff: Backoff

    def retry_in(self, job: Job, requested: Requested = BACKOFF) -> float | None:
        """Seconds until the next attempt, or None: attempts are exhausted (or the handler
        discarded the job, ``requested`` None), the job is dead. ``requested`` seconds (the
        handler raised Retry) replace the backoff."""
        backoff = self.registry.backoff_for(job) or self.default_backoff
        return retry_delay(job.attempt, job.max_attempts, backoff, requested)

    def failure(
        self,
        job: Job,
        message: str,
        requested: Requested = BACKOFF,
        error: AttemptError | None = None,
    ) -> Failure:
        """What this failed attempt of ``job`` leads to (``Outcomes.fail`` records it)."""
        registry = self.registry
        return Failure(
            message,
            self.retry_in(job, requested),
            dead_letter=registry.has_dead_handler(job),
            exclusive_key=job.key_seq is not None and registry.key_mode_for(job) == EXCLUSIVE,
            error=error,
        )

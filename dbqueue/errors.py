"""dbqueue's exceptions.

Every error a user can cause carries a message that names what was wrong and what to do about it.
Driver errors are translated into these at the edge (dialect modules), so callers never need to
know which database raised them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any


class DbqueueError(Exception):
    """Base class of every error dbqueue raises on purpose."""


class ConfigurationError(DbqueueError):
    """A setting, URL, dialect or name is wrong; the message says which and how to fix it."""


class UnsafeIdentifierError(ConfigurationError):
    """A table, schema, prefix or queue name that could not be used safely in SQL."""


class PayloadError(DbqueueError):
    """A payload that cannot be stored (not JSON-serialisable, or too large)."""


class SchemaMissingError(DbqueueError):
    """The queue tables are absent or older than this version of dbqueue expects."""


class StrategyNotSupportedError(ConfigurationError):
    """A claim strategy the connected database (or its version) cannot provide."""


class UnknownTaskError(DbqueueError):
    """A claimed job names a task no handler is registered for in this worker."""


class UnknownTaskWarning(UserWarning):
    """An enqueue names a task the App registers no handler for, while it registers others: a
    misspelt name, most likely (``warnings.simplefilter("error", UnknownTaskWarning)`` makes it
    an error, e.g. in tests)."""


class JobTimeoutError(DbqueueError):
    """A handler ran past its task's timeout."""


class DatabaseUnavailableError(DbqueueError):
    """The database cannot be reached or refused the credentials."""


class AttemptFailed(DbqueueError):
    """Raised by a handler to fail the attempt with exactly this message, without a traceback.

    The built-in webhook handler uses it: a 500 or a timeout is an expected outcome whose
    message (status, response excerpt) says everything; a stack trace would only bury it.
    The attempt is retried, then dead-lettered, like any other failure.
    """


class TenantDatabaseError(AttemptFailed):
    """A job's tenant database could not be opened (no tenant, an unknown one, a refused
    token, an unreachable server): a failed attempt naming the tenant and the cause, retried
    and dead-lettered by the usual rules."""


class JobFailedError(DbqueueError):
    """The job whose result was asked for is dead: its attempts ran out, or its handler raised
    ``Discard``. ``job_id`` names it and ``last_error`` holds the last attempt's message (the
    exception and its traceback). It will never have a result; ``dbqueue dead requeue`` runs it
    again."""

    def __init__(
        self, message: str = "", job_id: int | None = None, last_error: str | None = None
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.last_error = last_error


class JobCancelledError(JobFailedError):
    """A job was cancelled (``app.cancel``).

    Raised by ``app.result`` / ``app.call`` for a cancelled job (``job_id``): it will never have
    a result — a kind of JobFailedError, so that ``except JobFailedError`` covers every job that
    cannot answer. Also raised in a running handler's thread by the worker when the handler did
    not stop by itself soon after ``job.cancel_requested()`` turned true: the job ends
    ``cancelled``, its writes rolled back; it is not retried."""


class JobNotFinishedError(DbqueueError, TimeoutError):
    """The job has not finished within the time the caller gave (none: it was not finished when
    asked). A ``TimeoutError`` too. The job is left as it is and may still run: ``job_id``
    names it for a later ``app.result(job_id)``."""

    def __init__(self, message: str, job_id: int) -> None:
        super().__init__(message)
        self.job_id = job_id


class JobNotFoundError(DbqueueError, LookupError):
    """No job has this id (never enqueued here, or purged after its retention period)."""


class CallFromHandlerError(DbqueueError):
    """``app.call`` from inside a handler: the handler would wait, holding a worker thread and
    its transaction, for a job that may need that very thread."""


class Discard(Exception):  # noqa: N818 - the issue's public name
    """Raised by a handler: the job is dead at once, whatever attempts it has left, and its dead
    handler runs (as for a job whose attempts ran out). The attempt is recorded like any failed
    one, with ``Discard: <reason>`` as its message; its session's writes roll back."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = str(reason)


class Retry(Exception):  # noqa: N818 - the issue's public name
    """Raised by a handler: run the job again in exactly ``in_seconds`` (a number or a
    ``timedelta``), instead of after the task's backoff. The attempt counts, and is recorded
    like a failed one with ``Retry: …`` as its message; its session's writes roll back. On the
    job's last attempt it dies as any failure would, and its dead handler runs."""

    def __init__(self, reason: str = "", *, in_seconds: float | Any) -> None:
        seconds = in_seconds.total_seconds() if isinstance(in_seconds, timedelta) else in_seconds
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not 0 <= seconds < 10**9
        ):
            raise ValueError(
                f"Retry(in_seconds={in_seconds!r}): in_seconds must be a number of seconds "
                "(or a timedelta), 0 or more"
            )
        super().__init__(reason)
        self.reason = str(reason)
        self.in_seconds = float(seconds)


class EagerJobError(DbqueueError):
    """Eager mode with ``eager_raise``: a job run at commit died (or could not run here).

    Raised after the enqueuing transaction committed and every job it made has run: the jobs
    stay recorded as a worker would leave them. ``failures`` holds one dict per job that died
    (``id``, ``task``, ``status``, ``message``: the last attempt's error and traceback).
    """

    def __init__(self, message: str, failures: list[dict[str, object]]) -> None:
        super().__init__(message)
        self.failures = failures

"""dbqueue's exceptions.

Every error a user can cause carries a message that names what was wrong and what to do about it.
Driver errors are translated into these at the edge (dialect modules), so callers never need to
know which database raised them.
"""

from __future__ import annotations


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


class JobTimeoutError(DbqueueError):
    """A handler ran past its task's timeout."""


class JobCancelledError(DbqueueError):
    """A running job was cancelled (``app.cancel``): raised in its handler's thread by the
    worker when the handler did not stop by itself soon after ``job.cancel_requested()``
    turned true. The job ends ``cancelled``, its writes rolled back; it is not retried."""


class DatabaseUnavailableError(DbqueueError):
    """The database cannot be reached or refused the credentials."""


class AttemptFailed(DbqueueError):
    """Raised by a handler to fail the attempt with exactly this message, without a traceback.

    The built-in webhook handler uses it: a 500 or a timeout is an expected outcome whose
    message (status, response excerpt) says everything; a stack trace would only bury it.
    The attempt is retried, then dead-lettered, like any other failure.
    """


class EagerJobError(DbqueueError):
    """Eager mode with ``eager_raise``: a job run at commit died (or could not run here).

    Raised after the enqueuing transaction committed and every job it made has run: the jobs
    stay recorded as a worker would leave them. ``failures`` holds one dict per job that died
    (``id``, ``task``, ``status``, ``message``: the last attempt's error and traceback).
    """

    def __init__(self, message: str, failures: list[dict[str, object]]) -> None:
        super().__init__(message)
        self.failures = failures

"""dbqueue: durable job queues in your application's own relational database.

This module is the package's composition root. It names the public API, each name loaded from
its module on first use (so that ``import dbqueue.errors`` loads what errors needs, not the
whole package), and it hands the schema layer the one thing that layer cannot import: each
database's column types, which live in the database modules above it (``dbqueue.dialects``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dbqueue.schema import types as _column_types

if TYPE_CHECKING:  # the public names, for type checkers (``X as X``: re-exported)
    from dbqueue.app.facade import App as App
    from dbqueue.base.results import Message as Message
    from dbqueue.compat import (
        DeadSubscriber as DeadSubscriber,
    )
    from dbqueue.compat import (
        QueueClient as QueueClient,
    )
    from dbqueue.compat import (
        Subscriber as Subscriber,
    )
    from dbqueue.compat import (
        WorkerBase as WorkerBase,
    )
    from dbqueue.compat import (
        WorkerPubSubBase as WorkerPubSubBase,
    )
    from dbqueue.config import Settings as Settings
    from dbqueue.errors import (
        AttemptFailed as AttemptFailed,
    )
    from dbqueue.errors import (
        CallFromHandlerError as CallFromHandlerError,
    )
    from dbqueue.errors import (
        ConfigurationError as ConfigurationError,
    )
    from dbqueue.errors import (
        DatabaseUnavailableError as DatabaseUnavailableError,
    )
    from dbqueue.errors import (
        DbqueueError as DbqueueError,
    )
    from dbqueue.errors import (
        Discard as Discard,
    )
    from dbqueue.errors import (
        EagerJobError as EagerJobError,
    )
    from dbqueue.errors import (
        JobCancelledError as JobCancelledError,
    )
    from dbqueue.errors import (
        JobFailedError as JobFailedError,
    )
    from dbqueue.errors import (
        JobNotFinishedError as JobNotFinishedError,
    )
    from dbqueue.errors import (
        JobNotFoundError as JobNotFoundError,
    )
    from dbqueue.errors import (
        JobTimeoutError as JobTimeoutError,
    )
    from dbqueue.errors import (
        PayloadError as PayloadError,
    )
    from dbqueue.errors import (
        Retry as Retry,
    )
    from dbqueue.errors import (
        SchemaMissingError as SchemaMissingError,
    )
    from dbqueue.errors import (
        StrategyNotSupportedError as StrategyNotSupportedError,
    )
    from dbqueue.errors import (
        UnknownTaskError as UnknownTaskError,
    )
    from dbqueue.errors import (
        UnknownTaskWarning as UnknownTaskWarning,
    )
    from dbqueue.errors import (
        UnsafeIdentifierError as UnsafeIdentifierError,
    )
    from dbqueue.job import Job as Job
    from dbqueue.job import MalformedPayload as MalformedPayload
    from dbqueue.job import Status as Status
    from dbqueue.pubsub.subscriptions import Subscription as Subscription
    from dbqueue.pubsub.webhooks import DEFAULT_WEBHOOK_TIMEOUT as DEFAULT_WEBHOOK_TIMEOUT
    from dbqueue.tasks.retry import linear_backoff as linear_backoff
    from dbqueue.tasks.retry import polynomial_backoff as polynomial_backoff
    from dbqueue.worker import (
        JobSession as JobSession,
    )
    from dbqueue.worker import (
        Worker as Worker,
    )
    from dbqueue.worker import (
        WorkerSummary as WorkerSummary,
    )

__version__ = "0.1.0"

#: Each public name → the module that defines it.
_PUBLIC: dict[str, str] = {
    "App": "dbqueue.app.facade",
    "AttemptFailed": "dbqueue.errors",
    "CallFromHandlerError": "dbqueue.errors",
    "ConfigurationError": "dbqueue.errors",
    "DatabaseUnavailableError": "dbqueue.errors",
    "DbqueueError": "dbqueue.errors",
    "DeadSubscriber": "dbqueue.compat",
    "DEFAULT_WEBHOOK_TIMEOUT": "dbqueue.pubsub.webhooks",
    "Discard": "dbqueue.errors",
    "EagerJobError": "dbqueue.errors",
    "Job": "dbqueue.job",
    "JobCancelledError": "dbqueue.errors",
    "JobFailedError": "dbqueue.errors",
    "JobNotFinishedError": "dbqueue.errors",
    "JobNotFoundError": "dbqueue.errors",
    "JobSession": "dbqueue.worker",
    "JobTimeoutError": "dbqueue.errors",
    "linear_backoff": "dbqueue.tasks.retry",
    "MalformedPayload": "dbqueue.job",
    "Message": "dbqueue.base.results",
    "PayloadError": "dbqueue.errors",
    "polynomial_backoff": "dbqueue.tasks.retry",
    "QueueClient": "dbqueue.compat",
    "Retry": "dbqueue.errors",
    "SchemaMissingError": "dbqueue.errors",
    "Settings": "dbqueue.config",
    "Status": "dbqueue.job",
    "StrategyNotSupportedError": "dbqueue.errors",
    "Subscriber": "dbqueue.compat",
    "Subscription": "dbqueue.pubsub.subscriptions",
    "UnknownTaskError": "dbqueue.errors",
    "UnknownTaskWarning": "dbqueue.errors",
    "UnsafeIdentifierError": "dbqueue.errors",
    "Worker": "dbqueue.worker",
    "WorkerBase": "dbqueue.compat",
    "WorkerPubSubBase": "dbqueue.compat",
    "WorkerSummary": "dbqueue.worker",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'dbqueue' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


def _database_types(sqlalchemy_name: str) -> _column_types.DatabaseTypes:
    """One database's column types, from its module (imported when a table first compiles)."""
    from dbqueue.dialects.registry import database_types

    return database_types(sqlalchemy_name)


_column_types.use_database_types(_database_types)

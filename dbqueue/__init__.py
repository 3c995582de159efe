"""dbqueue: durable job queues in your application's own relational database."""

# First, and for its side effect too: each database module registers its column types and DDL
# clock with the schema layer below it, so a table compiles for any database whatever
# ``dbqueue.…`` module a program imports (Python runs this file before any of them).
from . import dialects  # noqa: F401
from .app import App
from .compat import DeadSubscriber, QueueClient, Subscriber, WorkerBase, WorkerPubSubBase
from .config import Settings
from .errors import (
    AttemptFailed,
    ConfigurationError,
    DatabaseUnavailableError,
    DbqueueError,
    EagerJobError,
    JobCancelledError,
    JobTimeoutError,
    PayloadError,
    SchemaMissingError,
    StrategyNotSupportedError,
    UnknownTaskError,
    UnsafeIdentifierError,
)
from .job import Job, MalformedPayload, Status
from .pubsub import Subscription
from .retry import linear_backoff
from .webhooks import DEFAULT_WEBHOOK_TIMEOUT
from .worker import JobSession, Worker, WorkerSummary
from .worker.eager import EagerRunner

# The composition root: the App facade builds workers without importing the layer above it.
App.worker_class = Worker
App.eager_runner_class = EagerRunner

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_WEBHOOK_TIMEOUT",
    "App",
    "AttemptFailed",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "DbqueueError",
    "EagerJobError",
    "DeadSubscriber",
    "Job",
    "JobCancelledError",
    "JobSession",
    "JobTimeoutError",
    "MalformedPayload",
    "PayloadError",
    "QueueClient",
    "SchemaMissingError",
    "Settings",
    "Status",
    "StrategyNotSupportedError",
    "Subscriber",
    "Subscription",
    "UnknownTaskError",
    "UnsafeIdentifierError",
    "Worker",
    "WorkerBase",
    "WorkerPubSubBase",
    "WorkerSummary",
    "linear_backoff",
]

"""dbqueue: durable job queues in your application's own relational database."""

from .app import App
from .config import Settings
from .errors import (
    AttemptFailed,
    ConfigurationError,
    DatabaseUnavailableError,
    DbqueueError,
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
from .seed import DeadSubscriber, QueueClient, Subscriber, WorkerBase, WorkerPubSubBase
from .webhooks import DEFAULT_WEBHOOK_TIMEOUT
from .worker import JobSession, Worker, WorkerSummary

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_WEBHOOK_TIMEOUT",
    "App",
    "AttemptFailed",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "DbqueueError",
    "DeadSubscriber",
    "Job",
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

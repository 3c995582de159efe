"""dbqueue: durable job queues in your application's own relational database."""

from .app import App
from .config import Settings
from .errors import (
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
from .retry import linear_backoff
from .seed import QueueClient, WorkerBase
from .worker import JobSession, Worker, WorkerSummary

__version__ = "0.1.0"

__all__ = [
    "App",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "DbqueueError",
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
    "UnknownTaskError",
    "UnsafeIdentifierError",
    "Worker",
    "WorkerBase",
    "WorkerSummary",
    "linear_backoff",
]

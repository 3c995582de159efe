"""``dbqueue.tracing``: OpenTelemetry traces.

A documented import path, kept: the code lives in ``dbqueue.observability.tracing``."""

from dbqueue.observability.tracing import (
    SYSTEM,
    instrument,
)

__all__ = [
    "SYSTEM",
    "instrument",
]

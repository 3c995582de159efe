"""``dbqueue.logs``: log output for log collectors (``JsonFormatter``).

A documented import path, kept: the code lives in ``dbqueue.cli.logs``."""

from dbqueue.cli.logs import (
    LOG_FORMATS,
    TEXT_FORMAT,
    JsonFormatter,
    handler,
)

__all__ = [
    "TEXT_FORMAT",
    "LOG_FORMATS",
    "JsonFormatter",
    "handler",
]

"""Log output for log collectors: one JSON object per line (``dbqueue … --log-format json``).

A collector (Loki, CloudWatch, Elasticsearch, journald) splits its input on newlines; a record
spread over several lines — a traceback — arrives as unrelated fragments. Here every record is
one line: the message and the traceback are JSON strings, their newlines escaped.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from dbqueue.errors import ConfigurationError

#: What ``LogRecord`` itself carries, and this formatter's own fields; any other attribute came
#: from ``extra=`` and becomes a field.
_NOT_EXTRA = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "timestamp",
    "level",
    "logger",
    "exception",
    "stack",
}

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """``{"timestamp", "level", "logger", "message", <extra fields>, "exception"}`` per line.

    Built for a record per job: one encoder for every record, and the timestamp's date and time
    formatted once per second."""

    _encode = json.JSONEncoder(default=str, ensure_ascii=False).encode

    def __init__(self) -> None:
        super().__init__()
        self._second: tuple[int, str] = (-1, "")  # one attribute: threads swap it whole

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": self._timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **{k: v for k, v in record.__dict__.items() if k not in _NOT_EXTRA},
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return self._encode(entry)

    def _timestamp(self, created: float) -> str:
        """ISO 8601 in UTC, to the millisecond: ``2025-05-01T12:00:00.123Z``."""
        second = int(created)
        cached, text = self._second
        if cached != second:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, text)
        return f"{text}.{int((created - second) * 1000):03d}Z"


def handler(log_format: str, stream: Any) -> logging.Handler:
    """A handler writing ``text`` (the default) or ``json`` lines to ``stream``."""
    if log_format not in LOG_FORMATS:
        raise ConfigurationError(f"log format {log_format!r}: use one of {', '.join(LOG_FORMATS)}")
    chosen = logging.StreamHandler(stream)
    chosen.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    return chosen

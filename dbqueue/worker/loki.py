"""Shipping a worker's log records to Grafana Loki (the seed's GRAFANA_URL, labelled with ENV).

Built on ``inuits-python-logging-loki`` (the maintained fork of python-logging-loki: the push
API's payload, its HTTP session, and a batch handler flushed by size or interval), arranged so
that logging never blocks a job: the job's thread only puts the record on a bounded queue
(``put_nowait``; a full queue drops the record and counts it), and one background thread
pushes batches. A push that fails (Loki unreachable, a non-204 answer) drops its batch and
counts it; memory stays bounded by the queue and one batch.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
from logging.handlers import QueueHandler
from typing import Any
from urllib.parse import urlsplit

from dbqueue.base.distribution import install_hint
from dbqueue.base.service import Service
from dbqueue.config import Settings
from dbqueue.errors import ConfigurationError

DEFAULT_ENV = "DEV"
PUSH_PATH = "/loki/api/v1/push"
#: Records waiting for the pushing thread; past it, new records are dropped (and counted).
QUEUE_SIZE = 10_000
#: Records per push, and the longest a record waits for one (seconds).
BATCH_SIZE = 500
BATCH_INTERVAL = 1.0
#: Loggers never shipped: the HTTP client's and the library's own, so that a push cannot log
#: records that need a push.
_NOT_SHIPPED = ("urllib3", "requests", "waylay", "dbqueue.grafana")

log = logging.getLogger("dbqueue.grafana")


def push_url(grafana_url: str) -> str:
    """GRAFANA_URL as Loki's push endpoint: a bare host gets the push API's path."""
    parts = urlsplit(grafana_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigurationError(
            f"GRAFANA_URL={grafana_url!r} is not an http(s) URL: give Loki's address, e.g. "
            "http://loki:3100 (the push path /loki/api/v1/push is added when missing)"
        )
    if parts.path in ("", "/"):
        return grafana_url.rstrip("/") + PUSH_PATH
    return grafana_url


class _Bounded(QueueHandler):
    """Formats in the logging thread, puts without waiting; a full queue drops and counts."""

    def __init__(self, shipper: LokiShipper, records: queue.Queue[Any]) -> None:
        super().__init__(records)
        self.shipper = shipper

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith(_NOT_SHIPPED):
            return False
        return bool(super().filter(record))

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.shipper.count(dropped=1)


class LokiShipper(Service):
    """The root logger's records → Loki, from ``start`` to ``stop``. ``sent`` and
    ``dropped`` count records. Its thread hands the queued records to the batch handler,
    whose own thread pushes them."""

    name = "dbqueue-log-shipper"
    stop_timeout = None

    def __init__(
        self,
        url: str,
        env: str = DEFAULT_ENV,
        *,
        queue_size: int = QUEUE_SIZE,
        batch_size: int = BATCH_SIZE,
        interval: float = BATCH_INTERVAL,
        timeout: tuple[float, float] = (2.0, 5.0),
    ) -> None:
        try:
            from logging_loki.handlers import LokiBatchHandler  # type: ignore[import-untyped]
        except ImportError:
            raise ConfigurationError(
                "GRAFANA_URL is set but the Loki handler is not installed: "
                f"{install_hint('grafana')} (or unset GRAFANA_URL)"
            ) from None
        super().__init__()
        self.url = push_url(url)
        self.env = env
        self.sent = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._failures = 0
        self._records: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._pusher = _pusher_class()(
            self, url=self.url, tags={"env": env, "service": "dbqueue"}, timeout=timeout
        )
        self._batcher = LokiBatchHandler(interval, capacity=batch_size, target=self._pusher)
        self.handler = _Bounded(self, self._records)

    @classmethod
    def from_settings(cls, settings: Settings) -> LokiShipper | None:
        if not settings.grafana_url:
            return None
        return cls(settings.grafana_url, settings.env or DEFAULT_ENV)

    def count(self, *, sent: int = 0, dropped: int = 0) -> None:
        with self._lock:
            self.sent += sent
            self.dropped += dropped

    def before_start(self) -> None:
        logging.getLogger().addHandler(self.handler)
        log.info("shipping logs to Loki at %s (env=%s)", self.url, self.env)

    def run(self) -> None:
        while (record := self._records.get()) is not None:
            self._batcher.handle(record)
            self.iterations.add()

    def interrupt(self) -> None:
        """Detach, then queue the end marker behind the records (waiting for room: the queue
        may be full)."""
        logging.getLogger().removeHandler(self.handler)
        self._records.put(None)

    def after_stop(self) -> None:
        """Push what is left (one last try)."""
        self._batcher.close()
        if self.dropped:
            log.warning("Loki shipping: %d record(s) sent, %d dropped", self.sent, self.dropped)

    def failed(self, count: int, exc: BaseException) -> None:
        """A push failed: its records are dropped; said on stderr now and then (never through
        logging, which would ship the news of the failure)."""
        self.count(dropped=count)
        self._failures += 1
        if self._failures == 1 or self._failures % 100 == 0:
            print(
                f"dbqueue: Loki push to {self.url} failed ({type(exc).__name__}: {exc}); "
                f"{self.dropped} record(s) dropped so far",
                file=sys.stderr,
            )


def _pusher_class() -> type:
    """The library's LokiHandler, counting what each batch push sends or drops, and stamping
    each entry with its record's time (the library stamps the push's)."""
    from logging_loki.emitter import LokiEmitter  # type: ignore[import-untyped]
    from logging_loki.handlers import LokiHandler  # type: ignore[import-untyped, unused-ignore]

    class Emitter(LokiEmitter):  # type: ignore[misc]
        def build_payload(self, record: logging.LogRecord, line: str) -> dict[str, Any]:
            payload: dict[str, Any] = super().build_payload(record, line)
            payload["streams"][0]["values"][0][0] = str(int(record.created * 1e9))
            return payload

    class Pusher(LokiHandler):  # type: ignore[misc]
        def __init__(self, shipper: LokiShipper, **options: Any) -> None:
            super().__init__(**options)
            self.shipper = shipper
            self.emitter = Emitter(options["url"], options["tags"], timeout=options["timeout"])

        def emit_batch(self, records: list[logging.LogRecord]) -> None:
            if not records:
                return
            try:
                self.emitter.emit_batch([(record, self.format(record)) for record in records])
            except Exception as exc:
                if hasattr(exc, "response") or not hasattr(exc, "status_code"):
                    self.emitter.close()  # the transport is suspect: a new session next time
                self.shipper.failed(len(records), exc)
                return
            self.shipper.count(sent=len(records))

    return Pusher

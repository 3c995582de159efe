"""GRAFANA_URL: a worker's log records go to Loki's push API, labelled with ENV, batched in a
background thread; a Loki that hangs or is unreachable never holds up logging (nor a job), and
what cannot be pushed is dropped and counted. Loki is played by a real local HTTP server."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from support.http_server import Recorded, RecordingServer, closed_port

import dbqueue
from dbqueue.errors import ConfigurationError
from dbqueue.migrations import migrate
from dbqueue.worker.loki import PUSH_PATH, LokiShipper, push_url

log = logging.getLogger("tests.grafana")


@pytest.fixture
def loki():
    server = RecordingServer()
    server.routes[PUSH_PATH] = lambda request: (204, b"")
    yield server
    server.close()


def _entries(server: RecordingServer) -> list[tuple[dict[str, str], int, str]]:
    """(labels, timestamp ns, line) of every entry Loki received."""
    found = []
    for request in server.received(PUSH_PATH):
        for stream in json.loads(request.body)["streams"]:
            for ts, line in stream["values"]:
                found.append((stream["stream"], int(ts), line))
    return found


def _app(tmp_path, grafana_url: str) -> dbqueue.App:
    app = dbqueue.App(
        f"sqlite:///{tmp_path / 'queue.db'}",
        environ={"GRAFANA_URL": grafana_url, "ENV": "STAGING"},
    )
    migrate.upgrade(app.engine, app.names)

    @app.task("chatty")
    def chatty(job, session):
        log.warning("hello from job %s", job.id)

    return app


def test_worker_logs_reach_loki_labelled_with_env(tmp_path, loki):
    app = _app(tmp_path, loki.url(""))  # a bare address: the push path is added
    ids = [app.enqueue(None, "chatty", {}) for _ in range(5)]
    started = time.time_ns()
    worker = app.worker(burst=True, poll_interval=0.02, install_signal_handlers=False)
    assert worker.run().succeeded == 5
    ours = [e for e in _entries(loki) if e[2].startswith("hello from job")]
    assert sorted(line for _, _, line in ours) == sorted(f"hello from job {i}" for i in ids)
    for labels, ts, _ in ours:
        assert labels == {
            "env": "STAGING",
            "service": "dbqueue",
            "severity": "warning",
            "logger": "tests.grafana",
        }
        assert started <= ts <= time.time_ns()  # the record's time, not the push's
    assert worker.log_shipper is not None
    assert worker.log_shipper.sent >= 5 and worker.log_shipper.dropped == 0
    assert worker.log_shipper.handler not in logging.getLogger().handlers  # detached


def test_an_unreachable_loki_drops_and_counts_and_jobs_still_run(tmp_path, capsys):
    app = _app(tmp_path, f"http://127.0.0.1:{closed_port()}")
    for _ in range(5):
        app.enqueue(None, "chatty", {})
    worker = app.worker(burst=True, poll_interval=0.02, install_signal_handlers=False)
    assert worker.run().succeeded == 5
    shipper = worker.log_shipper
    assert shipper is not None
    assert shipper.sent == 0 and shipper.dropped >= 5
    assert "Loki push to http://127.0.0.1:" in capsys.readouterr().err


def test_a_hanging_loki_never_blocks_logging_and_memory_stays_bounded(loki):
    """The push thread is stuck inside a request while 990 more records are logged: every
    call returns, the queue keeps at most 50, the rest are dropped and counted."""
    entered = threading.Event()

    def hang(request: Recorded) -> tuple[int, bytes]:
        entered.set()
        loki.release.wait(10)
        return 204, b""

    loki.routes["/stuck" + PUSH_PATH] = hang
    shipper = LokiShipper(
        loki.url("/stuck" + PUSH_PATH), "DEV", queue_size=50, batch_size=10, timeout=(1, 30)
    ).start()
    try:
        for n in range(10):
            log.warning("record %d", n)
        assert entered.wait(10), "the first batch was never pushed"
        for n in range(10, 1000):
            log.warning("record %d", n)
        assert not loki.release.is_set()  # all 1000 calls returned while the push hung
        queued = shipper.handler.queue.qsize()
        assert queued <= 50
        assert shipper.dropped >= 1000 - 10 - 50 - 10
    finally:
        loki.release.set()
        shipper.stop()
    assert shipper.sent + shipper.dropped == 1000


def test_grafana_url_must_be_http():
    with pytest.raises(ConfigurationError, match="GRAFANA_URL='loki:3100' is not an http"):
        push_url("loki:3100")
    assert push_url("http://loki:3100/") == "http://loki:3100/loki/api/v1/push"
    assert push_url("https://logs.example/custom/push") == "https://logs.example/custom/push"

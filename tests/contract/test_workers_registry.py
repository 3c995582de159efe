"""The registry of live workers, ``running`` under every strategy, and the Prometheus metrics
of a real worker process (``dbqueue worker --metrics-port``) and of the queue collector.

One worker process per pair: while two of its jobs block, the registry lists the process (host,
pid, queues, concurrency, strategy, the two jobs), ``app.stats()`` counts them ``running`` (under
skip_locked and SQLite their rows still say ``available``) and the queue collector's ``/metrics``
agrees; once everything has run, the worker's ``/metrics``, parsed with prometheus-client's
parser, counts exactly the attempts the jobs table records. Killed with SIGKILL, the worker's
row expires, and maintenance forgets it. (A worker stopped by SIGTERM deletes its row:
tests/test_tracing.py.)
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import urllib.request
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.cli_runner import invoke
from support.registry_worker import QUEUE, free_port, start_worker
from support.waiting import wait_for

from dbqueue.observability import metrics


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) → value, from a /metrics page."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return samples(response.read().decode())


def by_task(found: dict, name: str) -> dict[str, float]:
    return {
        dict(labels)["task"]: value
        for (sample, labels), value in found.items()
        if sample == name and dict(labels).get("queue") == QUEUE
    }


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:
        pass


def serve_collector(app) -> tuple[str, object]:
    """The ready-made WSGI /metrics app of the queue collector, on a real local server."""
    server = make_server("127.0.0.1", 0, metrics.make_wsgi_app(app), handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}/metrics", server


def test_registry_running_and_metrics_of_a_real_worker(backend, tmp_path):
    app = backend.app()
    enqueues = CollectorRegistry()
    metrics.instrument(app, registry=enqueues)
    release = tmp_path / "release"
    # SQLite runs one batch at a time (its one write lock): one job blocks there, two elsewhere.
    running = 1 if backend.single_writer else 2
    started = [tmp_path / f"started-{n}" for n in range(running)]
    blocked = [
        app.enqueue(None, "block", {"started": str(f), "release": str(release)}, queue=QUEUE)
        for f in started
    ]
    # This App does not register the tasks: their max_attempts are given here.
    tasks = [("quick", 1)] * 3 + [("flaky", 2), ("doomed", 1)]
    app.enqueue_many(None, [{"task": task, "queue": QUEUE, "max_attempts": n} for task, n in tasks])
    port, log = free_port(), tmp_path / "worker.log"
    worker = start_worker(backend, log, port)
    collector_url, collector = serve_collector(app)
    try:
        wait_for(lambda: all(f.exists() for f in started), 90, "both block jobs to start", log)
        wait_for(
            lambda: [w.running for w in app.workers()] == [running],
            30,
            "a heartbeat with the jobs",
            log,
        )
        (info,) = app.workers()
        assert (info.pid, info.host) == (worker.pid, socket.gethostname())
        assert (info.queues, info.concurrency, info.strategy) == ([QUEUE], 2, backend.strategy)
        assert info.alive and sorted(job["id"] for job in info.jobs) == sorted(blocked)
        assert {job["task"] for job in info.jobs} == {"block"}
        (summary,) = [s for s in app.stats() if s.queue == QUEUE]
        assert summary.running == running, summary.by_status
        # The running ones are not counted twice (as available too): every job once.
        assert sum(summary.by_status.values()) == running + 5, summary.by_status
        gauges = scrape(collector_url)
        assert gauges[("dbqueue_queue_jobs", (("queue", QUEUE), ("status", "running")))] == running
        assert gauges[("dbqueue_workers", ())] == 1 and gauges[("dbqueue_up", ())] == 1
        listed = invoke(
            ["workers", "--json", "--url", backend.url, "--table-prefix", backend.prefix],
            tmp_path,
            backend.env(),
        )
        assert listed.exit_code == 0, listed.stderr
        assert [row["pid"] for row in json.loads(listed.stdout)] == [worker.pid]
        release.write_text("go")
        wait_for(
            lambda: all(j["status"] in ("succeeded", "dead") for j in backend.jobs()),
            90,
            "every job to finish",
            log,
        )
        jobs = backend.jobs()
        attempts = {task: 0 for task in ("block", "quick", "flaky", "doomed")}
        for job in jobs:
            attempts[job["task"]] += job["attempt"]
        assert attempts == {"block": running, "quick": 3, "flaky": 2, "doomed": 1}
        wait_for(
            lambda: (
                by_task(scrape(f"http://127.0.0.1:{port}/metrics"), "dbqueue_jobs_processed_total")
                == attempts
            ),
            30,
            "the worker's counters to catch up",
            log,
        )
        found = scrape(f"http://127.0.0.1:{port}/metrics")
        assert by_task(found, "dbqueue_jobs_succeeded_total") == {
            "block": running,
            "quick": 3,
            "flaky": 1,
        }
        assert by_task(found, "dbqueue_jobs_failed_total") == {"flaky": 1, "doomed": 1}
        assert by_task(found, "dbqueue_jobs_retried_total") == {"flaky": 1}
        assert by_task(found, "dbqueue_jobs_dead_total") == {"doomed": 1}
        assert by_task(found, "dbqueue_job_duration_seconds_count") == attempts
        assert by_task(found, "dbqueue_job_queue_time_seconds_count") == attempts
        enqueued = by_task(
            samples(generate_latest(enqueues).decode()), "dbqueue_jobs_enqueued_total"
        )
        assert enqueued == {"block": running, "quick": 3, "flaky": 1, "doomed": 1}
        wait_for(
            lambda: [(w.processed, w.failed) for w in app.workers()] == [(6 + running, 2)],
            30,
            "the heartbeat's counters",
            log,
        )
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
        wait_for(lambda: not app.workers(), 30, "the killed worker's row to expire", log)
        assert [w.pid for w in app.workers(include_gone=True)] == [worker.pid]
        assert "forgot 1 gone worker(s)" in app.run_maintenance("rescue")
        assert app.workers(include_gone=True) == []
    finally:
        collector.shutdown()
        if worker.poll() is None:
            worker.kill()
            worker.wait(30)

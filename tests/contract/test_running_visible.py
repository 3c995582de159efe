"""A running job is running for every reader, whatever the claim strategy.

Under a claim held in the worker's open transaction (skip_locked, SQLite) the job's row says
``available`` until the outcome commits; under a committed claim it says ``running``. Either
way ``app.stats()``, ``dbqueue stats --json``, ``/api/v1/stats``, the queue collector's lag
gauge, the dashboard (overview, ``/jobs?status=…``, the job page) and ``find_equivalent`` agree
that it runs, on which worker and at which attempt, and that it does not wait (no lag); once it
ends they agree it finished.

The first test runs a real worker process (support/registry_app.py's ``block`` handler, which
waits for a file the test writes at the end). The second writes a registry row by hand, to pin
down the rule: a listing counts while the row still says ``available`` at the attempt before
the one listed, and no longer once the attempt's outcome moved the row on.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import socket
from collections.abc import Iterator

import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.cli_runner import invoke
from support.dashboard import serve_asgi
from support.registry_worker import QUEUE, register_worker, set_job_row, start_worker
from support.waiting import wait_for

import dbqueue
from dbqueue.app import running
from dbqueue.dashboard import create_app, queries
from dbqueue.observability import metrics

#: A queue no worker of these tests serves: its job waits, and its lag shows.
IDLE = "idle"
AN_HOUR = 3600


def an_hour_ago() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=AN_HOUR)


def summaries(app: dbqueue.App) -> dict[str, dbqueue.app.monitoring.QueueSummary]:
    return {summary.queue: summary for summary in app.stats()}


def gauges(app: dbqueue.App) -> dict[tuple[str, tuple], float]:
    """The queue collector's samples, as /metrics shows them."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.QueueCollector(app, max_age=0))
    found = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def listed_statuses(base: str, **params: str) -> dict[int, str]:
    """id → status of the jobs a dashboard list shows."""
    page = requests.get(f"{base}/jobs", params=params, timeout=60)
    assert page.status_code == 200, page.text
    return {int(i): s for i, s in re.findall(r'data-id="(\d+)" data-status="(\w+)"', page.text)}


def overview_row(base: str, queue: str) -> list[str]:
    """The overview's cells for ``queue``: available, scheduled, running, succeeded, dead,
    cancelled, lag."""
    page = requests.get(f"{base}/", timeout=60).text
    row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', page, re.S)
    assert row is not None, page
    cells = re.findall(r'<td class="n">(.*?)</td>', row.group(1), re.S)
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in cells]


def job_page(base: str, job_id: int) -> str:
    page = requests.get(f"{base}/jobs/{job_id}", timeout=60)
    assert page.status_code == 200, page.text
    return page.text


def cli_stats(backend, tmp_path) -> dict:
    ran = invoke(
        ["stats", "--json", "--url", backend.url, "--table-prefix", backend.prefix],
        tmp_path,
        backend.env(),
    )
    assert ran.exit_code == 0, ran.stderr
    return json.loads(ran.stdout)


@contextlib.contextmanager
def dashboard(app: dbqueue.App) -> Iterator[str]:
    with serve_asgi(create_app(app, read_only=True)) as base:
        yield base


def test_a_running_job_is_running_for_every_reader(backend, tmp_path):
    app = backend.app()
    started, release = tmp_path / "started", tmp_path / "release"
    payload = {"started": str(started), "release": str(release)}
    # Both became runnable an hour ago: a lag that counted the running job would be an hour.
    job_id = app.enqueue(None, "block", payload, queue=QUEUE, run_at=an_hour_ago(), max_attempts=3)
    waiting_id = app.enqueue(None, "quick", queue=IDLE, run_at=an_hour_ago())
    log = tmp_path / "worker.log"
    worker = start_worker(backend, log, None)
    try:
        wait_for(started.exists, 90, "the job to start", log)
        wait_for(
            lambda: [job["id"] for w in app.workers() for job in w.jobs] == [job_id],
            30,
            "a heartbeat listing the job",
            log,
        )
        worker_name = f"{socket.gethostname()}:{worker.pid}"

        found = summaries(app)
        assert found[QUEUE].by_status["running"] == 1, found[QUEUE].by_status
        assert found[QUEUE].by_status["available"] == 0, found[QUEUE].by_status
        assert found[QUEUE].oldest_runnable_age is None  # nothing of the queue waits
        assert found[IDLE].by_status["available"] == 1
        assert found[IDLE].oldest_runnable_age >= AN_HOUR - 60  # a waiting job still lags
        report = app.stats_report()
        assert cli_stats(backend, tmp_path)["by_queue"][QUEUE] == report["by_queue"][QUEUE]
        assert report["by_queue"][QUEUE]["lag"] == 0 and report["by_queue"][QUEUE]["length"] == 0
        assert report["by_queue"][QUEUE]["counts"]["running"] == 1
        assert report["total"]["counts"]["running"] == 1 and report["total"]["length"] == 1
        samples = gauges(app)
        assert samples[("dbqueue_queue_lag_seconds", (("queue", QUEUE),))] == 0
        assert samples[("dbqueue_queue_lag_seconds", (("queue", IDLE),))] >= AN_HOUR - 60
        assert samples[("dbqueue_queue_jobs", (("queue", QUEUE), ("status", "running")))] == 1

        (equivalent,) = app.find_equivalent(None, "block", payload)
        assert (equivalent["id"], equivalent["status"], equivalent["attempt"]) == (
            job_id,
            "running",
            1,
        )
        (equivalent,) = app.find_equivalent(None, "block", payload, statuses=["running"])
        assert equivalent["id"] == job_id
        assert app.find_equivalent(None, "block", payload, statuses=["available"]) == []

        with dashboard(app) as base:
            assert listed_statuses(base, status="running") == {job_id: "running"}
            assert listed_statuses(base, status="available") == {waiting_id: "available"}
            assert listed_statuses(base, queue=QUEUE) == {job_id: "running"}
            assert overview_row(base, QUEUE) == ["0", "0", "1", "0", "0", "0", "0.0 s"]
            page = job_page(base, job_id)
            line = re.search(r'<p id="running">(.*?)</p>', page, re.S)
            assert line is not None, page
            text = re.sub(r"<[^>]+>", "", line.group(1))
            assert re.fullmatch(
                rf"running on worker {re.escape(worker_name)} since \d{{4}}-\d\d-\d\d "
                r"\d\d:\d\d:\d\d UTC, attempt 1 of 3",
                text,
            ), text

            release.write_text("go")
            wait_for(
                lambda: app.get_job(job_id)["status"] == "succeeded", 90, "the job to end", log
            )
            found = summaries(app)
            assert found[QUEUE].by_status["running"] == 0, found[QUEUE].by_status
            assert found[QUEUE].by_status["succeeded"] == 1, found[QUEUE].by_status
            assert app.stats_report()["total"]["counts"]["running"] == 0
            assert (
                gauges(app)[("dbqueue_queue_jobs", (("queue", QUEUE), ("status", "running")))] == 0
            )
            assert app.find_equivalent(None, "block", payload) == []
            (done,) = app.find_equivalent(None, "block", payload, statuses=["succeeded"])
            assert (done["id"], done["attempt"]) == (job_id, 1)
            assert listed_statuses(base, status="running") == {}
            assert listed_statuses(base, queue=QUEUE) == {job_id: "succeeded"}
            assert overview_row(base, QUEUE) == ["0", "0", "0", "1", "0", "0", "0.0 s"]
            page = job_page(base, job_id)
            assert 'id="running"' not in page and 'class="status succeeded"' in page
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(30)


def dashboard_statuses(app: dbqueue.App, status: str) -> dict[int, str]:
    where = queries.JobFilter(queue=IDLE, status=status)
    with app.engine.connect() as conn:
        rows, _ = queries.list_jobs(app, conn, where, None, queries.running_now(app, conn, where))
    return {row["id"]: row["status"] for row in rows}


def test_a_listing_counts_while_the_row_is_at_the_attempt_before(database):
    app = database.app()
    listed_id = app.enqueue(None, "hand", {"n": 1}, queue=IDLE, run_at=an_hour_ago())
    ten_minutes_ago = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=10)
    app.enqueue(None, "hand", {"n": 2}, queue=IDLE, run_at=ten_minutes_ago)
    since = dt.datetime.now(dt.timezone.utc).isoformat()
    listing = {"id": listed_id, "queue": IDLE, "task": "hand", "attempt": 1, "since": since}
    register_worker(app, "hand:1", [listing], [IDLE])

    # Listed, its row at attempt 0 and available: its first attempt runs in a transaction.
    summary = summaries(app)[IDLE]
    assert (summary.by_status["running"], summary.by_status["available"]) == (1, 1)
    assert 0 < summary.oldest_runnable_age < AN_HOUR / 2  # the other job's wait alone
    (found,) = app.find_equivalent(None, "hand", {"n": 1})
    assert (found["status"], found["attempt"]) == ("running", 1)
    assert dashboard_statuses(app, "running") == {listed_id: "running"}
    assert listed_id not in dashboard_statuses(app, "available")
    seed = dbqueue.QueueClient(app.engine, app=app)
    (found,) = seed.list_equivalent_task(None, None, "hand", None, {"n": 1}, status=["processando"])
    assert found["id"] == listed_id
    assert seed.list_equivalent_task(None, None, "hand", None, {"n": 1}) == []  # not pendente

    # The attempt failed and its outcome committed (attempt 1, waiting for a retry): the
    # heartbeat that still lists it is stale, and the job waits again.
    set_job_row(app, listed_id, attempt=1)
    summary = summaries(app)[IDLE]
    assert (summary.by_status["running"], summary.by_status["available"]) == (0, 2)
    assert summary.oldest_runnable_age >= AN_HOUR - 60
    (found,) = app.find_equivalent(None, "hand", {"n": 1})
    assert (found["status"], found["attempt"]) == ("available", 1)
    assert app.find_equivalent(None, "hand", {"n": 1}, statuses=["running"]) == []
    (found,) = seed.list_equivalent_task(None, None, "hand", None, {"n": 1})
    assert found["id"] == listed_id
    assert dashboard_statuses(app, "running") == {}

    # Claimed again by a committed claim the registry does not list yet: its row tells.
    set_job_row(app, listed_id, status="running", attempt=2, worker_id="other:2:0")
    summary = summaries(app)[IDLE]
    assert (summary.by_status["running"], summary.by_status["available"]) == (1, 1)
    with app.engine.connect() as conn:
        row = app.get_job(listed_id, conn)
        (now,) = running.of_rows(app.context, conn, [row]).values()
    assert (now.worker, now.attempt, now.in_transaction) == ("other:2:0", 2, False)
    assert dashboard_statuses(app, "running") == {listed_id: "running"}

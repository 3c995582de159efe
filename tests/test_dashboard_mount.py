"""The dashboard mounted inside a user's web application — Starlette (ASGI; FastAPI mounts the
same way) and Flask (WSGI, through ``dbqueue.dashboard.wsgi_app``) — served for real on
127.0.0.1: its links carry the mount prefix and an action posted through the mount changes the
database. And ``dbqueue dashboard`` itself, as a process: its /api/v1/stats is `dbqueue stats
--json`, and a non-loopback bind without a token is refused."""

from __future__ import annotations

import re
import subprocess
import time

import pytest
import requests
from support.cli_runner import assert_one_line_error, invoke
from support.dashboard import free_port, serve_asgi, serve_wsgi
from test_cli import DBQUEUE

from dbqueue.dashboard import create_app, wsgi_app

pytestmark = pytest.mark.parametrize("database", ["sqlite"], indirect=True)


def one_dead_job(database):
    app = database.app(max_attempts=1)
    job_id = app.enqueue(None, "mount_missing_task", {"n": 1})
    database.run_worker(app)  # no handler: it dies at once
    assert app.get_job(job_id)["status"] == "dead"
    return app, job_id


def requeue_through(base: str, job_id: int) -> requests.Response:
    """What a browser does: load the dead page (CSRF cookie and field), post its form."""
    session = requests.Session()
    page = session.get(f"{base}/dead", timeout=30)
    assert page.status_code == 200, page.text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    return session.post(
        f"{base}/actions/requeue", data={"ids": job_id, "csrf": csrf, "next": "/dead"}, timeout=30
    )


def test_mounted_in_starlette(database):
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    app, job_id = one_dead_job(database)
    board = create_app(app, actions_without_token=True)  # the host app authenticates
    host = Starlette(
        routes=[Route("/", lambda r: PlainTextResponse("host")), Mount("/ops/queue", board)]
    )
    with serve_asgi(host) as url:
        page = requests.get(f"{url}/ops/queue/jobs", timeout=30).text
        assert 'href="/ops/queue/jobs/' in page and 'href="/ops/queue/static/style.css"' in page
        assert requests.get(f"{url}/ops/queue/static/style.css", timeout=30).status_code == 200
        stats = requests.get(f"{url}/ops/queue/api/v1/stats", timeout=30).json()
        assert stats == app.stats_report() and stats["total"]["morgue_length"] == 1
        metrics = requests.get(f"{url}/ops/queue/metrics", timeout=30).text
        assert 'dbqueue_queue_jobs{queue="default",status="dead"} 1.0' in metrics
        done = requeue_through(f"{url}/ops/queue", job_id)
        assert done.status_code == 200 and done.url.startswith(f"{url}/ops/queue/dead?done=")
    assert app.get_job(job_id)["status"] == "available"


def test_mounted_in_flask(database):
    flask = pytest.importorskip("flask")
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    app, job_id = one_dead_job(database)
    host = flask.Flask(__name__)
    host.add_url_rule("/", "home", lambda: "host")
    host.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
        host.wsgi_app, {"/ops/queue": wsgi_app(app, actions_without_token=True)}
    )
    with serve_wsgi(host) as url:
        assert requests.get(url, timeout=30).text == "host"
        page = requests.get(f"{url}/ops/queue/dead", timeout=30).text
        assert f'href="/ops/queue/jobs/{job_id}"' in page
        done = requeue_through(f"{url}/ops/queue", job_id)
        assert done.status_code == 200 and done.url.startswith(f"{url}/ops/queue/dead?done=")
    assert app.get_job(job_id)["status"] == "available"


def test_the_dashboard_command(database, tmp_path):
    app, _ = one_dead_job(database)
    options = ["--url", database.url, "--table-prefix", database.prefix]
    refused = invoke(["dashboard", *options, "--bind", "0.0.0.0", "--port", "0"], tmp_path)
    assert_one_line_error(
        refused, "not a loopback address", "DBQUEUE_DASHBOARD_TOKEN", "--read-only"
    )
    port = free_port()
    process = subprocess.Popen(
        [DBQUEUE, "dashboard", *options, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                served = requests.get(f"http://127.0.0.1:{port}/api/v1/stats", timeout=5).json()
                break
            except requests.ConnectionError:
                assert process.poll() is None, process.stderr.read()
                assert time.monotonic() < deadline, "the dashboard did not start"
                time.sleep(0.2)
        # `dbqueue stats --json` prints app.stats_report() (tests/test_cli.py)
        assert served == app.stats_report() and served["total"]["morgue_length"] == 1
    finally:
        process.terminate()
        process.wait(30)

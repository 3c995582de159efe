"""The dashboard's job page lists the job's failed attempts: time, attempt, message and a
collapsible traceback of the handler's frames, newest first."""

from __future__ import annotations

import html
import re

import pytest
import requests
from support.dashboard import serve_asgi

from dbqueue.dashboard import create_app

pytestmark = pytest.mark.parametrize("database", ["sqlite"], indirect=True)


def test_the_job_page_lists_every_attempts_error(database):
    app = database.app(backoff=lambda attempt: 0)

    @app.task("flaky", max_attempts=2)
    def flaky_import(job, session):
        raise ValueError(f"row {job.attempt} <bad>")

    failing = app.enqueue(None, "flaky", {})
    database.drain(app)
    waiting = app.enqueue(None, "later", {}, delay=3600)
    with serve_asgi(create_app(app, read_only=True)) as url:
        page = requests.get(f"{url}/jobs/{failing}", timeout=30).text
        quiet = requests.get(f"{url}/jobs/{waiting}", timeout=30).text
    table = page.split('id="errors"')[1].split("</table>")[0]
    assert re.findall(r'data-attempt="(\d+)"', table) == ["2", "1"]  # newest first
    assert "ValueError: row 2 &lt;bad&gt;" in table  # escaped
    tracebacks = re.findall(r"<details><summary>traceback</summary><pre>(.*?)</pre>", table, re.S)
    assert len(tracebacks) == 2
    for trace in map(html.unescape, tracebacks):
        assert ", in flaky_import" in trace and "/dbqueue/" not in trace
    times = re.findall(r"<td>(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)</td>", table)
    assert len(times) == 2 and times == sorted(times, reverse=True)
    columns = page.split('id="columns"')[1]
    assert "<th>errors</th>" not in columns  # shown above, not as raw JSON
    assert '<p id="errors">No failed attempt.</p>' in quiet

"""JSON logs and the per-job log line.

``--log-format json`` (or DBQUEUE_LOG_FORMAT=json) makes every line a command writes to stderr
one JSON object, tracebacks included; ``--log-jobs`` (``Worker(log_jobs=True)``,
DBQUEUE_LOG_JOBS=true) adds one INFO record per finished job on the ``dbqueue.jobs`` logger.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import textwrap

import pytest
from test_cli import run

from dbqueue.cli.logs import JsonFormatter

APP_MODULE = textwrap.dedent(
    """
    import dbqueue

    app = dbqueue.App(retry_base_interval=60)

    @app.task("log_ok")
    def log_ok(job, session):
        return "fine"

    @app.task("log_boom")
    def log_boom(job, session):
        raise ValueError("first line\\nsecond line")
    """
)
JOB_FIELDS = {"task", "job_id", "queue", "attempt", "outcome", "duration_ms"}


def json_lines(stderr: str) -> list[dict]:
    """Every line of ``stderr`` as JSON (a line that is not fails the test)."""
    records = []
    for line in stderr.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}\nin:\n{stderr}")
    return records


def enqueue_three(database) -> dict[str, int]:
    """ok → succeeded; boom with one attempt → dead; boom with two → failed (retry in 60 s)."""
    app = database.app()
    ids = {
        "succeeded": app.enqueue(None, "log_ok"),
        "dead": app.enqueue(None, "log_boom", max_attempts=1),
        "failed": app.enqueue(None, "log_boom", max_attempts=2),
    }
    app.engine.dispose()
    return ids


def run_worker(database, tmp_path, *options: str, env: dict | None = None):
    (tmp_path / "log_app.py").write_text(APP_MODULE)
    return run(
        "worker",
        "--url",
        database.url,
        "--table-prefix",
        database.prefix,
        "--app",
        "log_app",
        "--burst",
        *options,
        env={**database.env(), **(env or {})},
        cwd=tmp_path,
    )


def test_a_json_worker_writes_only_json_lines_and_one_per_job(database, tmp_path):
    ids = enqueue_three(database)
    result = run_worker(database, tmp_path, "--log-format", "json", "--log-jobs", "-v")
    assert result.returncode == 0, result.stderr
    records = json_lines(result.stderr)
    assert all({"timestamp", "level", "logger", "message"} <= set(r) for r in records)
    jobs = [r for r in records if r["logger"] == "dbqueue.jobs"]
    assert {r["job_id"]: r["outcome"] for r in jobs} == {v: k for k, v in ids.items()}
    for record in jobs:
        assert set(record) >= JOB_FIELDS and record["level"] == "INFO", record
        assert record["task"] == ("log_ok" if record["outcome"] == "succeeded" else "log_boom")
        assert (record["queue"], record["attempt"]) == ("default", 1)
        assert isinstance(record["duration_ms"], float) and record["duration_ms"] >= 0
    # -v logs each handler's exception: its traceback is a field of one line
    raised = [r for r in records if "exception" in r and "log_boom" in r["message"]]
    assert len(raised) == 2, records
    assert "Traceback" in raised[0]["exception"]
    assert "ValueError: first line\nsecond line" in raised[0]["exception"]
    stopped = [r for r in records if "stopped: 1 succeeded, 2 failed" in r["message"]]
    assert len(stopped) == 1


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
def test_the_environment_variables_turn_both_on(database, tmp_path):
    ids = enqueue_three(database)
    env = {"DBQUEUE_LOG_FORMAT": "json", "DBQUEUE_LOG_JOBS": "true"}
    result = run_worker(database, tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    jobs = [r for r in json_lines(result.stderr) if r["logger"] == "dbqueue.jobs"]
    assert sorted(r["job_id"] for r in jobs) == sorted(ids.values())
    database.app().enqueue(None, "log_ok")
    quiet = run_worker(database, tmp_path, "--no-log-jobs", env=env)  # the flag wins
    assert quiet.returncode == 0, quiet.stderr
    records = json_lines(quiet.stderr)
    assert any("stopped: 1 succeeded" in r["message"] for r in records), records
    assert not [r for r in records if r["logger"] == "dbqueue.jobs"]


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
def test_by_default_text_logs_and_no_job_lines(database, tmp_path):
    enqueue_three(database)
    result = run_worker(database, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "dbqueue.jobs" not in result.stderr
    assert "worker stopped: 1 succeeded, 2 failed" in result.stderr
    assert " INFO dbqueue.worker: " in result.stderr


def test_every_strategy_logs_each_committed_job_once(backend, caplog):
    """In process, on every (database, strategy) pair: the in-transaction claims, the
    committed claims, and SingleStore's transaction per job."""
    app = backend.app(retry_base_interval=60)
    app.task("log_ok")(lambda job, session: "fine")
    app.task("log_boom")(lambda job, session: 1 / 0)
    ids = enqueue_three(backend)
    caplog.set_level(logging.INFO, logger="dbqueue.jobs")
    backend.run_worker(app, log_jobs=True)
    jobs = [r for r in caplog.records if r.name == "dbqueue.jobs"]
    assert sorted((r.job_id, r.outcome, r.attempt) for r in jobs) == sorted(
        (job_id, outcome, 1) for outcome, job_id in ids.items()
    )
    caplog.clear()
    app.enqueue(None, "log_ok")
    assert backend.run_worker(app).succeeded == 1
    assert [r for r in caplog.records if r.name == "dbqueue.jobs"] == []  # off by default
    app.engine.dispose()


def test_the_json_formatter_keeps_a_traceback_and_extra_fields_on_one_line():
    try:
        raise RuntimeError("line one\nline two")
    except RuntimeError:
        record = logging.LogRecord(
            "dbqueue.test", logging.ERROR, __file__, 1, "failed: %s", ("x",), sys.exc_info()
        )
    record.job_id = 7
    record.when = object()  # not JSON: written as its str()
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert (entry["level"], entry["logger"], entry["message"], entry["job_id"]) == (
        "ERROR",
        "dbqueue.test",
        "failed: x",
        7,
    )
    assert entry["exception"].startswith("Traceback") and "line one\nline two" in entry["exception"]
    assert entry["when"].startswith("<object object")
    when = dt.datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00"))
    assert entry["timestamp"].endswith("Z") and len(entry["timestamp"]) == 24
    assert abs(when.timestamp() - record.created) < 0.001

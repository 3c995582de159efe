"""``dbqueue result ID [--wait S]`` and ``dbqueue job show ID [--json]``."""

from __future__ import annotations

import json

import pytest
from support.cli_runner import assert_one_line_error, invoke

NESTED = {"name": "olá", "lines": [1, 2.5, None, True], "empty": {}}


@pytest.fixture
def finished(database):
    """One succeeded, one dead and one scheduled job of the test database: their ids."""
    app = database.app()

    @app.task("answer")
    def answer(job, session):
        return NESTED

    @app.task("doomed", max_attempts=1)
    def doomed(job, session):
        raise RuntimeError("first line of the failure\nsecond line")

    ids = {
        "succeeded": app.enqueue(None, "answer", {"q": 1}),
        "dead": app.enqueue(None, "doomed", {}),
        "scheduled": app.enqueue(None, "answer", {}, delay=3600),
    }
    database.run_worker(app)
    return ids


def dbqueue(database, tmp_path, *args: str):
    options = ["--url", database.url, "--table-prefix", database.prefix]
    return invoke([*args[:2], *options, *args[2:]], tmp_path, database.env())


def test_result_prints_the_json_or_one_line_and_an_exit_status(database, finished, tmp_path):
    done = dbqueue(database, tmp_path, "result", str(finished["succeeded"]))
    assert (done.exit_code, done.exception) == (0, None), done.stderr
    assert json.loads(done.stdout) == NESTED and done.stdout.count("\n") == 1

    dead = dbqueue(database, tmp_path, "result", str(finished["dead"]))
    assert dead.exit_code == 3 and dead.stdout == ""
    (line,) = dead.stderr.splitlines()
    assert line.startswith(f"Error: job {finished['dead']} (task 'doomed') is dead after attempt")
    assert "RuntimeError: first line of the failure" in line

    for extra, said in (([], "pass timeout=SECONDS"), (["--wait", "0.2"], "within 0.2 s")):
        waiting = dbqueue(database, tmp_path, "result", str(finished["scheduled"]), *extra)
        assert waiting.exit_code == 5 and waiting.stdout == ""
        (line,) = waiting.stderr.splitlines()
        assert (
            line.startswith(f"Error: job {finished['scheduled']} (task 'answer'") and said in line
        )

    missing = dbqueue(database, tmp_path, "result", "987654321")
    assert_one_line_error(missing, "there is no job 987654321")


def test_job_show_prints_every_column(database, finished, tmp_path):
    job_id = finished["succeeded"]
    shown = dbqueue(database, tmp_path, "job", "show", str(job_id), "--json")
    assert (shown.exit_code, shown.exception) == (0, None), shown.stderr
    row = json.loads(shown.stdout)
    columns = [c.name for c in database.app().tables.jobs.columns]
    assert list(row) == columns
    assert (row["id"], row["status"], row["payload"], row["result"]) == (
        job_id,
        "succeeded",
        {"q": 1},
        NESTED,
    )

    text = dbqueue(database, tmp_path, "job", "show", str(job_id))
    assert text.exit_code == 0, text.stderr
    lines = text.stdout.splitlines()
    assert [line.split()[0].rstrip(":") for line in lines if not line.startswith(" ")] == columns
    assert [line.split() for line in lines if line.startswith("task ")] == [["task", "answer"]]
    assert "result:" in lines and '      "name": "olá"' in lines  # indented JSON

    dead = dbqueue(database, tmp_path, "job", "show", str(finished["dead"]))
    assert "message:" in dead.stdout.splitlines()  # a message of several lines, indented
    assert "    RuntimeError: first line of the failure" in dead.stdout.splitlines()
    # Its errors: one paragraph per attempt, the traceback the handler's frames only.
    errors = dead.stdout.split("\nerrors:\n")[1].splitlines()  # the last column
    assert errors[0].startswith("    attempt 1 at ") and errors[0].endswith(
        "Z: RuntimeError: first line of the failure"
    )
    assert errors[1:3] == ["    second line", "        Traceback (most recent call last):"]
    assert any(line.endswith(", in doomed") for line in errors)
    assert not [line for line in errors if "/dbqueue/" in line]
    dead_id = str(finished["dead"])
    shown = json.loads(dbqueue(database, tmp_path, "job", "show", dead_id, "--json").stdout)
    assert [e["attempt"] for e in shown["errors"]] == [1]

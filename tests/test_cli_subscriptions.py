"""``dbqueue subscriptions list|add|update|remove|disable|enable``: in this process through
click's runner (a process per command costs seconds on a loaded machine), and one worker run as a
real process, the way a user starts it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support import cli_runner
from support.http_server import RecordingServer
from test_cli import one_line_error, run


def run_here(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``dbqueue ARGS`` in this process, shaped like a finished process; a traceback fails."""
    outcome = cli_runner.invoke(list(args), cwd, env)
    assert outcome.exception is None, (outcome.stderr, outcome.exception)
    return subprocess.CompletedProcess(args, outcome.exit_code, outcome.stdout, outcome.stderr)


@pytest.fixture
def subs(database, tmp_path):
    """Run ``dbqueue subscriptions ARGS…`` on the test database's tables."""

    def invoke(command: str, *args: str):
        options = ["--url", database.url, "--table-prefix", database.prefix]
        return run_here("subscriptions", command, *options, *args, cwd=tmp_path)

    invoke.database = database
    return invoke


def test_add_list_disable_enable(subs):
    added = subs("add", "search_index", "--topic", "order.paid")
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("added search_index") and " code" in added.stdout

    added = subs(
        "add",
        "crm",
        "--topic",
        "order.paid",
        "--tenant",
        "7",
        "--business-group",
        "retail",
        "--webhook-url",
        "https://crm.example.com/hooks/orders?token=t0ps3cret&v=2",
        "--method",
        "put",
        "--header",
        "Authorization: Bearer very-secret-token",
        "--header",
        "X-Source: dbqueue",
    )
    assert added.returncode == 0, added.stderr

    listed = subs("list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["crm", "search_index"]
    crm = lines[0]
    assert "order.paid" in crm and "active" in crm
    assert "PUT https://crm.example.com/hooks/orders?token=***&v=2" in crm
    assert "tenant=7" in crm and "business_group=retail" in crm
    assert "Authorization: ***" in crm and "X-Source: dbqueue" in crm
    assert "very-secret-token" not in listed.stdout and "t0ps3cret" not in listed.stdout

    rows = {r["id"]: r for r in json.loads(subs("list", "--json").stdout)}
    assert rows["crm"]["http_method"] == "PUT" and rows["crm"]["tenant"] == 7
    assert rows["crm"]["headers"] == {"Authorization": "***", "X-Source": "dbqueue"}
    assert rows["search_index"]["url"] is None and rows["search_index"]["active"] is True

    # The row itself holds the real values: the webhook sends them.
    app = subs.database.app()
    stored = app.get_subscription("crm")
    assert stored.headers["Authorization"] == "Bearer very-secret-token"
    assert stored.url.endswith("?token=t0ps3cret&v=2")

    one_line_error(subs("add", "crm", "--topic", "other"), "subscription 'crm' already exists")
    one_line_error(subs("disable", "nope"), "no subscription 'nope'")

    disabled = subs("disable", "crm")
    assert disabled.returncode == 0 and "disabled subscription crm" in disabled.stdout
    assert "disabled" in subs("list", "--topic", "order.paid").stdout.splitlines()[0]
    publication_id = app.publish(None, "order.paid", {}, tenant=7, business_group="retail")
    reached = [j["subscription_id"] for j in subs.database.jobs() if j["publication_id"]]
    assert reached == ["search_index"] and app.get_job(publication_id)["status"] == "succeeded"

    enabled = subs("enable", "crm")
    assert enabled.returncode == 0 and "enabled subscription crm" in enabled.stdout
    assert app.get_subscription("crm").active is True
    assert subs("list", "--topic", "nothing").stdout.strip() == "no subscriptions"


def test_update_and_remove(subs):
    secret = "Authorization: Bearer s3cret-token"
    hook = ["--webhook-url", "https://a.example/hooks", "--header", secret]
    added = subs("add", "crm", "--topic", "order.paid", *hook)
    assert added.returncode == 0, added.stderr
    app = subs.database.app()

    changes = ["--topic", "order.sent", "--tenant", "3", "--method", "put"]
    updated = subs("update", "crm", *changes, "--webhook-url", "https://b.example/h?token=t0ps3")
    assert updated.returncode == 0, updated.stderr
    line = updated.stdout.strip()
    assert line.startswith("updated crm") and "order.sent" in line and "tenant=3" in line
    assert "PUT https://b.example/h?token=***" in line and "Authorization: ***" in line
    assert "s3cret-token" not in updated.stdout and "t0ps3" not in updated.stdout
    stored = app.get_subscription("crm")
    assert (stored.topic, stored.tenant, stored.http_method) == ("order.sent", 3, "PUT")
    assert stored.url == "https://b.example/h?token=t0ps3"
    assert stored.headers == {"Authorization": "Bearer s3cret-token"}  # untouched

    assert subs("update", "crm", "--clear", "tenant", "--header", "X-A: 1").returncode == 0
    stored = app.get_subscription("crm")
    assert stored.tenant is None and stored.headers == {"X-A": "1"} and stored.topic == "order.sent"

    one_line_error(subs("update", "crm", "--clear", "webhook-url"), "headers but no url")
    cleared = subs("update", "crm", "--clear", "webhook-url", "--clear", "headers")
    assert cleared.returncode == 0 and " code" in cleared.stdout, cleared.stderr
    assert app.get_subscription("crm").url is None

    removed = subs("remove", "crm")
    assert removed.returncode == 0 and removed.stdout.strip() == (
        "removed subscription crm (topic order.sent)"
    )
    assert app.get_subscription("crm") is None
    one_line_error(subs("remove", "crm"), "no subscription 'crm'", "subscriptions list")


def test_a_cli_worker_sends_webhooks_with_no_code(subs, tmp_path):
    """The seed's webhook worker: nothing to write but the subscription. With --app and
    --table-prefix the worker's webhook handler reads the prefixed subscriptions table."""
    server = RecordingServer()
    try:
        added = subs("add", "hook", "--topic", "order.paid", "--webhook-url", server.url("/ok"))
        assert added.returncode == 0, added.stderr
        (tmp_path / "plain_app.py").write_text("import dbqueue\napp = dbqueue.App()\n")
        app = subs.database.app()
        publication_id = app.publish(None, "order.paid", {"order": 1})
        options = ["--url", subs.database.url, "--table-prefix", subs.database.prefix, "--burst"]
        worker = run(
            "worker", *options, "--app", "plain_app:app", cwd=tmp_path, env=subs.database.env()
        )
        assert worker.returncode == 0, worker.stderr
        assert "worker stopped: 1 succeeded, 0 failed" in worker.stderr, worker.stderr
        assert [json.loads(r.body) for r in server.requests] == [{"order": 1}]
        (delivery,) = [j for j in subs.database.jobs() if j["publication_id"] == publication_id]
        assert delivery["status"] == "succeeded" and "200 OK" in delivery["message"]
    finally:
        server.close()


BAD_INPUT = [
    (
        ["add", "x", "--topic", "t", "--webhook-url", "https://a.example/", "--method", "PATCH"],
        ["http method 'PATCH'", "GET, POST or PUT"],
    ),
    (["add", "x", "--topic", "t", "--webhook-url", "ftp://a.example/"], ["http(s) URL"]),
    (["add", "x", "--topic", "t", "--webhook-url", "not a url"], ["spaces"]),
    (
        ["add", "x", "--topic", "t", "--webhook-url", "https://a.example/", "--header", "X"],
        ["--header 'X' is not 'Name: value'"],
    ),
    (
        ["add", "x", "--topic", "t", "--webhook-url", "https://a/", "--header", "A b: c"],
        ["header name 'A b' is not valid"],
    ),
    (["add", "x", "--topic", "t", "--header", "A: b"], ["headers but no url"]),
    (["add", "bad id", "--topic", "t"], ["subscription id 'bad id' is not allowed"]),
    (["add", "dup", "--topic", "t"], ["subscription 'dup' already exists"]),
    (["disable", "missing"], ["no subscription 'missing'", "subscriptions list"]),
    (["enable", "missing"], ["no subscription 'missing'"]),
    (["remove", "missing"], ["no subscription 'missing'"]),
    (["update", "missing", "--method", "GET"], ["no subscription 'missing'"]),
    (["update", "dup"], ["nothing to change", "--webhook-url"]),
    (["update", "dup", "--method", "PATCH"], ["http method 'PATCH'"]),
    (["update", "dup", "--topic", "a\tb"], ["task name 'a\\tb' is not allowed"]),
    (["update", "dup", "--tenant", "1", "--clear", "tenant"], ["--clear tenant and a new value"]),
    (["update", "dup", "--header", "A: b"], ["headers but no url"]),
    (["update", "dup", "--webhook-url", "ftp://a.example/"], ["http(s) URL"]),
]


def test_bad_input_is_a_one_line_error_and_changes_nothing(tmp_path):
    url = f"sqlite:///{tmp_path / 'subs.db'}"
    assert run_here("migrate", "--url", url, cwd=tmp_path).returncode == 0
    assert (
        run_here(
            "subscriptions", "add", "dup", "--url", url, "--topic", "t", cwd=tmp_path
        ).returncode
        == 0
    )
    for args, fragments in BAD_INPUT:
        result = run_here("subscriptions", args[0], "--url", url, *args[1:], cwd=tmp_path)
        one_line_error(result, *fragments)
    listed = run_here("subscriptions", "list", "--url", url, "--json", cwd=tmp_path)
    (dup,) = json.loads(listed.stdout)
    assert (dup["id"], dup["topic"], dup["http_method"], dup["url"]) == ("dup", "t", "POST", None)

"""The command line, run as a real process against real databases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.backends import PREFIX
from support.cli_runner import Outcome
from support.cli_runner import assert_one_line_error as one_line_error
from support.cli_runner import invoke as in_process

from dbqueue.migrations import migrate

DBQUEUE = str(Path(sys.executable).parent / "dbqueue")
APP_MODULE = textwrap.dedent(
    """
    import dbqueue
    from support.backends import effects

    app = dbqueue.App(retry_base_interval=0.01)

    @app.task("cli_effect", queue="cli")
    def cli_effect(job, session):
        session.execute(effects.insert().values(job_id=job.id, note="cli"))
        return "done by the cli worker"

    @app.task("cli_fail", max_attempts=1)
    def cli_fail(job, session):
        raise RuntimeError("always")

    @app.task("cli_options", queue="cli_q", priority=7, max_attempts=3)
    def cli_options(job, session):
        return None
    """
)


def run(
    *args: str, env: dict | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DBQUEUE_", "DB_")) or k.startswith("DBQUEUE_TEST_")
    }
    base["PYTHONPATH"] = os.pathsep.join(
        [str(cwd or Path.cwd()), str(Path(__file__).parent), base.get("PYTHONPATH", "")]
    )
    return subprocess.run(
        [DBQUEUE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **(env or {})},
        cwd=cwd,
    )


@pytest.fixture
def cli(database, tmp_path):
    """``cli(*args)``: ``dbqueue ARGS`` on the database's tables. ``worker`` runs as a real
    process; the other commands in this process (support/cli_runner.py: a process each costs a
    second of start-up; the tests below this fixture's run real processes of them)."""
    (tmp_path / "cli_app.py").write_text(APP_MODULE)
    sys.modules.pop("cli_app", None)  # an earlier test's, from another directory

    def invoke(*args: str, env: dict | None = None) -> subprocess.CompletedProcess | Outcome:
        options = ["--url", database.url, "--table-prefix", database.prefix]
        split = 2 if args[0] in ("dead", "maintenance") else 1  # after a group's subcommand
        env = {**database.env(), **(env or {})}
        argv = [*args[:split], *options, *args[split:]]
        if args[0] == "worker":
            return run(*argv, env=env, cwd=tmp_path)
        outcome = in_process(argv, tmp_path, env)
        assert outcome.exception is None, (outcome.stderr, outcome.exception)
        return outcome

    invoke.database = database
    return invoke


def test_enqueue_prints_the_id_and_stores_the_options(cli):
    result = cli(
        "enqueue",
        "cli_effect",
        "--payload",
        '{"order": 7}',
        "--queue",
        "cli",
        "--priority",
        "3",
        "--delay",
        "60",
        "--external-key",
        "order-7",
        "--tenant",
        "9",
    )
    assert result.returncode == 0, result.stderr
    (job,) = cli.database.jobs()
    assert int(result.stdout.strip()) == job["id"]
    assert (job["queue"], job["priority"], job["external_key"], job["tenant"]) == (
        "cli",
        3,
        "order-7",
        9,
    )
    assert job["payload"] == {"order": 7}
    assert (job["run_at"] - job["created_at"]).total_seconds() >= 59


def test_worker_runs_the_apps_tasks_then_stats_and_dead_jobs(cli):
    for _ in range(3):  # --app: the task's own queue and max_attempts apply
        assert (
            cli("enqueue", "cli_effect", "--payload", "{}", "--app", "cli_app:app").returncode == 0
        )
    assert cli("enqueue", "cli_fail", "--app", "cli_app:app").returncode == 0
    result = cli("worker", "--app", "cli_app:app", "--burst", "--concurrency", "2")
    assert result.returncode == 0, result.stderr
    assert "worker stopped: 3 succeeded, 1 failed" in result.stderr, (
        result.stderr,
        cli.database.jobs(),
    )
    assert len(cli.database.effect_ids()) == 3

    stats_run = cli("stats", "--json")
    stats = json.loads(stats_run.stdout)["by_queue"]
    assert "cli" in stats, (stats, stats_run.stderr, cli.database.jobs())
    assert stats["cli"]["counts"]["succeeded"] == 3 and stats["default"]["morgue_length"] == 1
    table = cli("stats").stdout
    assert "queue" in table and "cli" in table and "oldest runnable" in table

    dead = json.loads(cli("dead", "list", "--json").stdout)
    assert [d["task"] for d in dead] == ["cli_fail"]
    assert "cli_fail" in cli("dead", "list").stdout
    requeued = cli("dead", "requeue", str(dead[0]["id"]))
    assert requeued.returncode == 0 and f"requeued 1: {dead[0]['id']}" in requeued.stdout
    one_line_error(cli("dead", "requeue", str(dead[0]["id"])), "not dead", str(dead[0]["id"]))


def test_dead_requeue_all_by_filter_delete_and_order(cli):
    app = cli.database.app(max_attempts=1)
    ids = [
        app.enqueue(None, task, {}, queue=queue)
        for task, queue in [("cli_x", "q1"), ("cli_y", "q1"), ("cli_x", "q2")]
    ]
    cli.database.run_worker(app, queues=["q1", "q2"])  # no handler: each dies at once
    listed = json.loads(cli("dead", "list", "--json", "--order", "id").stdout)
    assert [d["id"] for d in listed] == ids
    only_x = json.loads(cli("dead", "list", "--json", "--task", "cli_x").stdout)
    assert sorted(d["id"] for d in only_x) == [ids[0], ids[2]]
    one_line_error(cli("dead", "requeue"), "give the job ids", "--all")
    one_line_error(cli("dead", "requeue", "--task", "cli_x"), "--task and --queue filter --all")
    one_line_error(cli("dead", "requeue", "--all", str(ids[0])), "not both")
    done = cli("dead", "requeue", "--all", "--task", "cli_x", "--queue", "q1")
    assert done.returncode == 0 and f"requeued 1: {ids[0]}" in done.stdout, done.stderr
    deleted = cli("dead", "delete", str(ids[1]))
    assert deleted.returncode == 0 and f"deleted 1: {ids[1]}" in deleted.stdout
    assert cli("dead", "requeue", "--all").stdout.startswith(f"requeued 1: {ids[2]}")
    assert {j["id"]: j["status"] for j in cli.database.jobs()} == {
        ids[0]: "available",
        ids[2]: "available",
    }


def test_enqueue_with_app_uses_the_tasks_options_and_knows_its_names(cli):
    app = ["--app", "cli_app:app"]
    registered = cli("enqueue", "cli_options", *app)
    explicit = cli(
        "enqueue", "cli_options", *app, "--queue", "q2", "--priority", "1", "--max-attempts", "9"
    )
    assert registered.returncode == 0 and explicit.returncode == 0, registered.stderr
    rows = {job["id"]: job for job in cli.database.jobs()}
    options = [rows[int(r.stdout)] for r in (registered, explicit)]
    assert [(j["queue"], j["priority"], j["max_attempts"]) for j in options] == [
        ("cli_q", 7, 3),
        ("q2", 1, 9),
    ]

    refused = cli("enqueue", "cli_optoins", *app, "--payload", "{}")
    one_line_error(
        refused, "unknown task 'cli_optoins'", "cli_app:app", "cli_effect, cli_fail, cli_options"
    )
    assert len(cli.database.jobs()) == 2
    assert cli("enqueue", "anything_at_all").returncode == 0  # without --app, any name


def test_stats_json_is_the_stats_report_in_lowkiqs_shape(cli):
    assert cli("enqueue", "cli_effect", "--queue", "cli").returncode == 0
    assert cli("enqueue", "cli_effect", "--queue", "cli", "--delay", "600").returncode == 0
    stats = json.loads(cli("stats", "--json").stdout)
    counts = {
        "available": 1,
        "scheduled": 1,
        "blocked": 0,
        "running": 0,
        "succeeded": 0,
        "dead": 0,
        "cancelled": 0,
    }
    lag = stats["by_queue"]["cli"]["lag"]
    assert stats == {
        "total": {"length": 2, "morgue_length": 0, "lag": lag, "counts": counts},
        "by_queue": {"cli": {"length": 2, "morgue_length": 0, "lag": lag, "counts": counts}},
    }
    assert lag >= 0
    (summary,) = cli.database.app().stats()
    assert summary.counts == {"available": 2}  # as stored, as before
    assert summary.by_status == counts


def test_worker_max_jobs(cli):
    for _ in range(5):
        cli("enqueue", "cli_effect", "--queue", "cli")
    result = cli("worker", "--app", "cli_app:app", "--max-jobs", "2")
    assert result.returncode == 0, result.stderr
    assert len(cli.database.effect_ids()) == 2


def test_maintenance_commands(cli):
    result = cli("maintenance", "run", "purge")
    assert result.returncode == 0 and result.stdout.startswith("deleted 0 finished jobs")
    status = json.loads(cli("maintenance", "status", "--json").stdout)
    assert {row["routine"]: row["runs"] for row in status}["purge"] == 1


def test_migrate_show(cli):
    result = cli("migrate", "--show")
    head = migrate.head_revision()
    assert result.returncode == 0 and f"current: {head}  latest: {head}" in result.stdout


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["stats", "--dialect", "oracle"], ["unknown dialect 'oracle'", "postgresql"]),
        (["stats", "--url", "not a url"], ["cannot parse database URL"]),
        (
            ["stats", "--url", "postgresql+psycopg2://postgres@127.0.0.1:1/test"],
            ["database error", "check --url"],
        ),
        (["stats", "--url", "sqlite:///x.db", "--dialect", "mysql"], ["does not match the URL"]),
        (["stats", "--app", "no_such_module:app"], ["there is no module 'no_such_module'"]),
        (["stats", "--app", "os:path"], ["not a dbqueue.App"]),
        (["stats", "--table-prefix", "x; drop"], ["table prefix", "not safe"]),
        (["enqueue", "t", "--payload", "{oops"], ["--payload is not valid JSON"]),
        (["worker", "--burst", "--strategy", "skip_locked"], ["skip_locked", "SQLite"]),
        (["worker", "--burst", "--concurrency", "0"], ["concurrency"]),
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path, args, fragments):
    db = tmp_path / "cli.db"
    if "--url" not in args:
        assert in_process(["migrate", "--url", f"sqlite:///{db}"], tmp_path).returncode == 0
        args = [args[0], "--url", f"sqlite:///{db}", *args[1:]]
    one_line_error(run(*args, cwd=tmp_path), *fragments)


def test_a_database_without_the_schema_says_to_migrate(tmp_path):
    result = run("worker", "--burst", "--url", f"sqlite:///{tmp_path / 'empty.db'}", cwd=tmp_path)
    one_line_error(result, "dbqueue migrate")


def test_url_from_dbqueue_url_and_from_the_seed_variables(postgresql, tmp_path):
    by_env = run("stats", "--table-prefix", PREFIX, env={"DBQUEUE_URL": postgresql.url})
    assert by_env.returncode == 0, by_env.stderr
    seed = {
        "DB_HOST": "127.0.0.1",
        "DB_PORT": "5432",
        "DB_BASE": "test",
        "DB_USER": "postgres",
        "DB_PASS": "",
    }
    by_seed = run("stats", "--dialect", "postgresql", "--table-prefix", PREFIX, env=seed)
    assert by_seed.returncode == 0, by_seed.stderr
    alias = {"DATABASE_HOST": "127.0.0.1", "DATABASE_NAME": "test", "DATABASE_USER": "postgres"}
    assert (
        run("stats", "--dialect", "postgresql", "--table-prefix", PREFIX, env=alias).returncode == 0
    )


def test_help_lists_the_commands_and_options():
    top = run("--help").stdout
    for command in ("worker", "migrate", "enqueue", "stats", "dead", "maintenance"):
        assert command in top
    worker = run("worker", "--help").stdout
    for option in (
        "--dialect",
        "--url",
        "--app",
        "--queue",
        "--concurrency",
        "--burst",
        "--max-jobs",
        "--max-runtime",
        "--strategy",
    ):
        assert option in worker

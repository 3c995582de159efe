"""Bad input at the command line: one line naming the problem and the fix, never a traceback."""

from __future__ import annotations

import secrets
import textwrap

import pytest
import sqlalchemy as sa
from support.backends import PREFIX, drop_queue_tables
from test_cli import one_line_error, run

import dbqueue
from dbqueue.migrations import migrate

SPIN_APP = textwrap.dedent(
    """
    import dbqueue

    app = dbqueue.App()

    @app.task("spin", max_attempts=1)
    def spin(job, session):
        while True:
            pass
    """
)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert run("migrate", "--url", url, cwd=tmp_path).returncode == 0
    return url


def test_wrong_credentials(database, tmp_path):
    url = sa.engine.make_url(database.url)
    if not database.has_server:
        wrong = f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}"
    else:
        wrong = url.set(username="dbqueue_nobody", password="s3cret-pw").render_as_string(False)
    for command in (["worker", "--burst"], ["stats"], ["migrate"]):
        result = run(*command, "--url", wrong, "--table-prefix", PREFIX, cwd=tmp_path)
        line = one_line_error(result, "check --url")
        assert "s3cret-pw" not in result.stderr + result.stdout, line


def test_a_schema_at_an_older_migration_names_dbqueue_migrate(database, tmp_path):
    prefix = f"clio_{secrets.token_hex(3)}_"
    app = dbqueue.App(database.url, table_prefix=prefix)
    engine = app.create_engine()
    try:
        migrate.upgrade(engine, app.names, "0001")
        result = run("worker", "--burst", "--url", database.url, "--table-prefix", prefix)
        one_line_error(result, "at migration 0001", "dbqueue migrate")
    finally:
        drop_queue_tables(engine, prefix)
        engine.dispose()


@pytest.mark.parametrize(
    "args, env, fragments",
    [
        (["worker", "--burst", "--queue", "a;b"], {}, ["queue name 'a;b' is not allowed"]),
        (["enqueue", "t", "--queue", "x y"], {}, ["queue name 'x y'"]),
        (["stats", "--schema", "public;drop"], {}, ["schema name 'public;drop'"]),
        (["stats"], {"DBQUEUE_TABLE_PREFIX": "p-"}, ["table prefix 'p-'"]),
        (["stats"], {"QUEUE_TABLE": "jobs;"}, ["jobs table name 'jobs;'"]),
        (
            ["enqueue", "t", "--payload", '{"blob": "' + "x" * 100 + '"}'],
            {"DBQUEUE_MAX_PAYLOAD_BYTES": "64"},
            ["over the limit of 64 bytes", "max_payload_bytes"],
        ),
        (["worker", "--burst", "--job-timeout", "0"], {}, ["job_timeout", "positive"]),
        (["worker", "--burst", "--job-timeout", "soon"], {}, ["job-timeout", "soon"]),
    ],
)
def test_bad_names_and_values(sqlite_url, tmp_path, args, env, fragments):
    result = run(*args[:1], "--url", sqlite_url, *args[1:], env=env, cwd=tmp_path)
    if "--job-timeout" in args and "soon" in args:  # click's own usage error: two lines
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert all(f in result.stderr for f in fragments), result.stderr
        return
    one_line_error(result, *fragments)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_job_timeout_from_the_command_line(sqlite_url, tmp_path, how):
    (tmp_path / "spin_app.py").write_text(SPIN_APP)
    app = dbqueue.App(sqlite_url)
    job_id = app.enqueue(None, "spin", max_attempts=1)
    app.engine.dispose()
    flag = ["--job-timeout", "0.3"] if how == "flag" else []
    env = {"DBQUEUE_JOB_TIMEOUT": "0.3"} if how == "env" else {}
    result = run(
        "worker",
        "--burst",
        "--url",
        sqlite_url,
        "--app",
        "spin_app:app",
        *flag,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    job = dbqueue.App(sqlite_url).get_job(job_id)
    assert job["status"] == "dead"
    assert job["message"].startswith(
        f"JobTimeoutError: job {job_id} (task 'spin') ran past its 0.3 s"
    )

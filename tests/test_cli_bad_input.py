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
        (["worker", "--burst", "--shutdown-timeout", "-1"], {}, ["shutdown_timeout", "0 or more"]),
        (["worker", "--burst"], {"DBQUEUE_SHUTDOWN_TIMEOUT": "-1"}, ["DBQUEUE_SHUTDOWN_TIMEOUT"]),
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


THUMBS_APP = textwrap.dedent(
    """
    import dbqueue

    app = dbqueue.App()
    reports = dbqueue.App(table_prefix="reports_")

    def thumbnail(job, session):
        return None
    """
)
#: module file → its text, for the --app mistakes below (written in the command's folder).
APP_MODULES = {
    "thumbs.py": THUMBS_APP,
    "plain.py": "VALUE = 1\n",
    "brokenmod.py": "import dbqueue\nimport no_such_dependency_xyz\n\napp = dbqueue.App()\n",
    "syntaxmod.py": "import dbqueue\n\napp = dbqueue.App(\n",
    "raising.py": "import dbqueue\n\nraise RuntimeError('THUMBS_DIR is not set')\n",
}


@pytest.mark.parametrize(
    "spec, line",
    [
        (
            "./thumbs.py",
            "--app ./thumbs.py: that is a file path; --app takes a module's dotted name: "
            "--app thumbs:app",
        ),
        (
            "jobs/thumbs.py:reports",
            "--app jobs/thumbs.py:reports: that is a file path; --app takes a module's dotted "
            "name: --app jobs.thumbs:reports (from the folder that holds jobs, or with it on "
            "PYTHONPATH)",
        ),
        (
            "thumbz:app",
            "--app thumbz:app: there is no module 'thumbz' (looked in {cwd} and sys.path): check "
            "the name, run the command from your project's folder, or set PYTHONPATH (e.g. --app "
            "myproject.jobs:app)",
        ),
        (
            "brokenmod:app",
            "--app brokenmod:app: module 'brokenmod' was found, but its own import of "
            "'no_such_dependency_xyz' failed at {cwd}/brokenmod.py line 2: No module named "
            "'no_such_dependency_xyz' (install it, or fix that import)",
        ),
        (
            "syntaxmod:app",
            "--app syntaxmod:app: module 'syntaxmod' has a syntax error in {cwd}/syntaxmod.py "
            "line 3: '(' was never closed; fix it and run the command again",
        ),
        (
            "raising",
            "--app raising: module 'raising' was found, but importing it raised RuntimeError at "
            "{cwd}/raising.py line 3: THUMBS_DIR is not set (-v shows the traceback)",
        ),
        (
            "thumbs:ap",
            "--app thumbs:ap: module 'thumbs' has no attribute 'ap'; use --app thumbs:app or "
            "--app thumbs:reports",
        ),
        (
            "thumbs:thumbnail",
            "--app thumbs:thumbnail: thumbs.thumbnail is a function, not a dbqueue.App; use "
            "--app thumbs:app or --app thumbs:reports",
        ),
        (
            "plain",
            "--app plain: module 'plain' has no attribute 'app'; the module has no dbqueue.App: "
            "create one there (app = dbqueue.App(…)) (e.g. --app myproject.jobs:app)",
        ),
    ],
    ids=[
        "file path",
        "file path in a folder",
        "no such module",
        "inner import fails",
        "syntax error",
        "import raises",
        "missing attribute",
        "not an App",
        "no App at all",
    ],
)
def test_every_app_mistake_is_one_line_naming_the_fix(sqlite_url, tmp_path, spec, line):
    for name, text in APP_MODULES.items():
        (tmp_path / name).write_text(text)
    result = run("stats", "--url", sqlite_url, "--app", spec, cwd=tmp_path)
    said = one_line_error(result)
    assert said == "Error: " + line.format(cwd=tmp_path), said
    assert result.stderr.strip() == said  # the one line, nothing else


def test_verbose_shows_the_imports_traceback_too(sqlite_url, tmp_path):
    (tmp_path / "brokenmod.py").write_text(APP_MODULES["brokenmod.py"])
    result = run("stats", "-v", "--url", sqlite_url, "--app", "brokenmod:app", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback (most recent call last)" in result.stderr
    assert "ModuleNotFoundError: No module named 'no_such_dependency_xyz'" in result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "Error: --app brokenmod:app: module 'brokenmod' was found, but its own import of "
        )
    )

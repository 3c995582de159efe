"""Every command of the CLI, found by walking the click group (a new command is covered without
touching this file), against an unmigrated database, a wrong URL and an unknown revision or id:
one line, ``Error: …``, naming the problem and the fix; exit 1; no traceback.

The commands run in this process (support/cli_runner.py); ``server``, which would serve forever
if a check let it through, runs as a real process with a timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import sqlalchemy as sa
from support.cli_runner import Outcome, assert_one_line_error, invoke, unmigrated_prefix
from test_cli import APP_MODULE, run

from dbqueue.cli.main import cli
from dbqueue.migrations import migrate

#: Commands that run until stopped: run as processes, so a check that lets one through fails
#: the test instead of hanging it.
SERVING = {("server",), ("dashboard",)}
#: Arguments a command needs to get as far as the database: not to serve, not to collide with
#: other servers, something to change.
ALWAYS = {
    ("worker",): ["--burst"],
    ("server",): ["--port", "0", "--notify-port", "0"],
    ("dashboard",): ["--port", "0"],
    ("subscriptions", "update"): ["--method", "GET"],
}
#: Variants of one command that reach the database by different paths.
VARIANTS = {
    ("migrate",): [[], ["--show"], ["--downgrade"]],
    **{("dead", verb): [["999999"], ["--all"]] for verb in ("requeue", "delete")},
}
#: On a database without the tables these succeed: they report or create the schema.
SUCCEED_UNMIGRATED = {("migrate",): "creates the tables", ("migrate", "--show"): "reports none"}
#: On a database without the tables these succeed, saying there is nothing to do.
NOTHING_TO_DO = {("migrate", "--downgrade"): "nothing to downgrade"}


def leaf_commands(group: click.Group = cli, path: tuple[str, ...] = ()) -> Iterator[Any]:
    """Through click's lookup, which loads the commands the top-level group loads lazily."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            yield from leaf_commands(command, (*path, name))
        else:
            yield (*path, name), command


COMMANDS = dict(leaf_commands())


def sample(param: click.Parameter) -> str:
    if isinstance(param.type, click.Choice):
        return str(param.type.choices[0])
    if isinstance(param.type, click.types.IntParamType):
        return "999999"
    return "cli_nope"


def required(command: click.Command) -> list[str]:
    """Values for the command's required arguments and options."""
    args: list[str] = []
    for param in command.params:
        if isinstance(param, click.Argument) and param.required:
            args.append(sample(param))
        elif isinstance(param, click.Option) and param.required:
            args += [param.opts[0], sample(param)]
    return args


def cases() -> list[tuple[str, ...]]:
    found = []
    for path in COMMANDS:
        for variant in VARIANTS.get(path, [[]]):
            found.append((*path, *variant))
    return found


def split(case: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    for length in range(len(case), 0, -1):
        if case[:length] in COMMANDS:
            return case[:length], list(case[length:])
    raise AssertionError(case)


def dbqueue_command(path: tuple[str, ...], extra: list[str], options: list[str], cwd: Path, env):
    args = [*path, *options, *ALWAYS.get(path, []), *required(COMMANDS[path]), *extra]
    if path in SERVING:
        done = run(*args, env=env, cwd=cwd)
        return Outcome(done.returncode, done.stdout, done.stderr)
    return invoke(args, cwd, env)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "cli_app.py").write_text(APP_MODULE)
    return tmp_path


@pytest.fixture
def fresh_prefix(database) -> Iterator[str]:
    with unmigrated_prefix(database) as prefix:
        yield prefix


@pytest.mark.parametrize("case", cases(), ids="-".join)
def test_on_a_database_without_the_tables(database, fresh_prefix, workdir, case):
    path, extra = split(case)
    options = ["--url", database.url, "--table-prefix", fresh_prefix]
    outcome = dbqueue_command(path, extra, options, workdir, database.env())
    if case in SUCCEED_UNMIGRATED or case in NOTHING_TO_DO:
        assert outcome.exit_code == 0 and outcome.exception is None, (outcome, outcome.stderr)
        if case in NOTHING_TO_DO:
            assert NOTHING_TO_DO[case] in outcome.stdout, outcome.stdout
        return
    line = assert_one_line_error(outcome, "run `dbqueue migrate`")
    assert "not exist" in line and fresh_prefix in line, line
    assert "check --url" not in line, line  # the server is fine: the tables are missing


@pytest.mark.parametrize("case", cases(), ids="-".join)
def test_with_no_url_only_migrate_creates_the_default_database(workdir, case):
    """Nothing names a database: the default SQLite file is named, with why; only `migrate`
    creates it (a read-only command must not leave an empty file behind)."""
    path, extra = split(case)
    outcome = dbqueue_command(path, extra, [], workdir, None)
    default = workdir / "dbqueue.db"
    why = "the database is the default, sqlite:///dbqueue.db"
    if case == ("migrate",):
        assert outcome.exit_code == 0, outcome.stderr
        assert outcome.stdout.startswith("migrated dbqueue_jobs on sqlite:///dbqueue.db")
        assert why in outcome.stderr and str(default) in outcome.stderr
        assert default.exists()
        return
    line = assert_one_line_error(outcome, why, str(default), "DBQUEUE_URL", "dbqueue migrate")
    assert "does not exist" in line
    assert not default.exists()


def wrong_url(database, tmp_path: Path) -> str:
    if not database.has_server:
        return f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}"
    return sa.engine.make_url(database.url).set(database="cli_no_such_db").render_as_string(False)


@pytest.mark.parametrize("case", cases(), ids="-".join)
def test_with_a_wrong_url(database, workdir, case):
    path, extra = split(case)
    options = ["--url", wrong_url(database, workdir), "--table-prefix", database.prefix]
    outcome = dbqueue_command(path, extra, options, workdir, database.env())
    assert_one_line_error(outcome, "check --url")
    assert not (workdir / "no-such-dir").exists()


@dataclass(frozen=True)
class Unknown:
    args: tuple[str, ...]
    fragments: tuple[str, ...]
    migrated: bool = True


HEAD = migrate.head_revision()
#: Commands that name something that must exist, and what naming something that does not says.
UNKNOWN: dict[tuple[str, ...], list[Unknown]] = {
    ("migrate",): [
        Unknown(("9999",), ("unknown migration revision '9999'", "0001", HEAD)),
        Unknown(("--downgrade", "9999"), ("unknown migration revision '9999'", "base")),
        Unknown(
            ("--downgrade", "0001"),
            ("cannot downgrade to 0001", "no migration", "run `dbqueue migrate 0001`"),
            migrated=False,
        ),
    ],
    **{
        ("dead", verb): [Unknown(("999999",), ("999999", "not dead", "dbqueue dead list"))]
        for verb in ("requeue", "delete")
    },
    **{
        path: [Unknown(("999999",), ("there is no job 999999", "purged after its retention"))]
        for path in (("result",), ("job", "show"))
    },
    ("cancel",): [Unknown(("999999",), ("no such job: 999999",))],
    ("cancel-publication",): [Unknown(("999999",), ("no publication 999999", "'*'"))],
    ("enqueue",): [
        Unknown(
            ("cli_nope", "--app", "cli_app:app"),
            ("unknown task 'cli_nope'", "cli_app:app", "cli_effect, cli_fail, cli_options"),
        )
    ],
    **{
        ("subscriptions", name): [
            Unknown(("cli_nope",), ("no subscription 'cli_nope'", "dbqueue subscriptions list"))
        ]
        for name in ("disable", "enable", "remove", "update")
    },
}
#: Commands whose arguments name nothing that must already exist.
NOTHING_TO_LOOK_UP = {
    ("subscriptions", "add"): "its argument is the new subscription's id",
    ("maintenance", "run"): "its argument is one of click's choices (a usage error)",
}


def test_every_command_that_takes_an_argument_is_covered():
    """A new command whose argument names something says here what an unknown one prints."""
    with_arguments = {
        path
        for path, command in COMMANDS.items()
        if any(isinstance(p, click.Argument) for p in command.params)
    }
    assert with_arguments == set(UNKNOWN) | set(NOTHING_TO_LOOK_UP)


@pytest.mark.parametrize(
    "path, unknown",
    [(path, unknown) for path, found in UNKNOWN.items() for unknown in found],
    ids=lambda v: "-".join(v) if isinstance(v, tuple) else "-".join(v.args),
)
def test_an_unknown_revision_or_id(database, fresh_prefix, workdir, path, unknown):
    prefix = database.prefix if unknown.migrated else fresh_prefix
    options = ["--url", database.url, "--table-prefix", prefix]
    args = [*path, *options, *ALWAYS.get(path, []), *unknown.args]
    outcome = invoke(args, workdir, database.env())
    assert_one_line_error(outcome, *unknown.fragments)

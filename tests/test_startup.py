"""What start-up loads: ``import dbqueue``, ``from dbqueue import App`` and ``dbqueue --help``
load neither a database's module nor its driver, Alembic, a command's module or an optional
extra; each of those loads when it is used. Every case runs in a fresh interpreter: the modules
this test process already holds say nothing about start-up. (How long start-up takes is
measured in benchmarks/startup.py, not here.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from support.backends import Backend

from dbqueue.cli.main import COMMANDS, LazyGroup, cli
from dbqueue.dialects import registry
from dbqueue.dialects.registry import MODULES

ROOT = Path(__file__).resolve().parents[1]
#: Each database's module (its SQLAlchemy dialect, maybe a third-party package with it).
DATABASE_MODULES = frozenset(module for module, _ in MODULES.values())
#: Packages (with their submodules) that only their use may load.
LOADED_ON_USE = (
    *DATABASE_MODULES,
    "alembic",
    "mako",
    "dbqueue.migrations",
    "psycopg2",
    "pymysql",
    "singlestoredb",
    "sqlalchemy_singlestoredb",
    "sqlalchemy.ext.asyncio",
    "greenlet",
    "asyncpg",
    "aiomysql",
    "aiosqlite",
    "starlette",
    "jinja2",
    "uvicorn",
    "a2wsgi",
    "prometheus_client",
    "opentelemetry",
    "requests",
    "dbqueue.dashboard",
)
#: The command-line modules that define commands (each loaded when its command is used).
COMMAND_MODULES = frozenset(lazy.module for lazy in COMMANDS.values())
MARK = "modules: "


def loaded_modules(code: str, env: dict[str, str] | None = None) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    script = f"{code}\nimport json, sys\nprint({MARK!r} + json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith(MARK))
    return set(json.loads(line.removeprefix(MARK)))


def among(modules: set[str], packages: tuple[str, ...] | frozenset[str]) -> set[str]:
    """The members of ``modules`` that are one of ``packages`` or inside one."""
    return {m for m in modules if any(m == p or m.startswith(f"{p}.") for p in packages)}


HELP = """
from dbqueue.cli.main import cli
try:
    cli([{args}], prog_name="dbqueue")
except SystemExit as exit:
    assert exit.code == 0, exit.code
"""


# ---- start-up loads none of them ---------------------------------------------------------------
@pytest.mark.parametrize(
    "code",
    ["import dbqueue", "from dbqueue import App, Worker", HELP.format(args="'--help'")],
    ids=["import dbqueue", "from dbqueue import App", "dbqueue --help"],
)
def test_start_up_loads_no_database_module_driver_alembic_or_extra(code: str) -> None:
    loaded = loaded_modules(code)
    assert "dbqueue" in loaded
    assert among(loaded, LOADED_ON_USE) == set()
    assert among(loaded, COMMAND_MODULES) == set()


# ---- each loads when used ----------------------------------------------------------------------
USE = """
import json, sys
import dbqueue
app = dbqueue.App({url!r}, table_prefix={prefix!r})
app.get_job(0)
read = sorted(sys.modules)
app.migrate()  # the tables are at the head already: nothing changes
print(json.dumps({{"read": read, "migrated": sorted(sys.modules)}}))
"""


def test_a_database_loads_its_own_module_and_driver_and_alembic_only_to_migrate(
    each_database: Backend,
) -> None:
    db = each_database
    engine = db.engine()
    driver = engine.dialect.loaded_dbapi.__name__.partition(".")[0]
    engine.dispose()
    own = db.dialect_class.__module__
    # What this database's module itself imports of the others (one may build on another's).
    alongside = among(loaded_modules(f"import dbqueue, {own}"), DATABASE_MODULES)
    done = subprocess.run(
        [sys.executable, "-c", USE.format(url=db.url, prefix=db.prefix)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **db.env()},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    read, migrated = set(found["read"]), set(found["migrated"])
    assert own in read and driver in read
    assert among(read, DATABASE_MODULES) == alongside
    assert among(read, ("alembic", "dbqueue.migrations")) == set()
    assert "alembic" in migrated and "dbqueue.migrations.migrate" in migrated


def test_a_command_loads_its_module_when_it_runs() -> None:
    loaded = loaded_modules(HELP.format(args="'worker', '--help'"))
    assert among(loaded, COMMAND_MODULES) == {COMMANDS["worker"].module}


# ---- the registry names what each module declares --------------------------------------------
def test_the_registry_maps_each_modules_own_names_to_it() -> None:
    """The registry finds a module by names written out in it (so as not to import them all):
    they are the ones each class declares, no more."""
    classes = registry.installed_classes()
    installed = {cls.name for cls in classes}
    assert installed <= set(MODULES)
    for cls in classes:
        assert MODULES[cls.name] == (cls.__module__, cls.__name__)
        assert registry.class_for_name(cls.name) is cls
    for table, attribute in (
        (registry.SQLALCHEMY_NAMES, "sqlalchemy_names"),
        (registry.URL_ALIASES, "url_aliases"),
    ):
        declared = {alias: cls.name for cls in classes for alias in getattr(cls, attribute)}
        assert {alias: name for alias, name in table.items() if name in installed} == declared


# ---- the list of commands is click's own ---------------------------------------------------
def test_each_summary_is_the_first_paragraph_of_its_commands_help() -> None:
    for name, lazy in COMMANDS.items():
        command = lazy.load()
        assert command.name == name
        first_paragraph = " ".join((command.help or "").split("\n\n")[0].split())
        assert lazy.summary == first_paragraph, name


@pytest.mark.parametrize("width", [50, 80, 120])
def test_the_help_lists_the_commands_as_click_would_with_every_one_loaded(width: int) -> None:
    def help_of(group: click.Group) -> str:
        ctx = click.Context(group, info_name="dbqueue", terminal_width=width)
        ctx.max_content_width = width
        return group.get_help(ctx)

    lazy = LazyGroup(name="dbqueue", help=cli.help, params=cli.params, lazy_commands=COMMANDS)
    loaded = click.Group(
        name="dbqueue",
        help=cli.help,
        params=cli.params,
        commands={name: entry.load() for name, entry in COMMANDS.items()},
    )
    assert help_of(lazy) == help_of(loaded)
    assert lazy.commands == {}  # listed from the summaries alone


def test_python_m_dbqueue_is_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dbqueue", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: dbqueue ")
    listed = done.stdout.split("Commands:")[1].split()
    assert set(COMMANDS) <= set(listed)

"""Schema migrations on every database, through every entry point.

The packaged Alembic revisions are the only way the queue tables come into being, so this file
checks that they (1) go up, down and up again, leaving a schema ``check_schema`` accepts only at
head; (2) build exactly the tables ``dbqueue.schema`` declares; (3) keep queues with different
prefixes — and PostgreSQL schemas — apart; (4) are reachable from ``alembic upgrade head`` in the
checkout, from ``dbqueue migrate`` (``--show``, ``--downgrade``) and from an installed wheel
that has no checkout to lean on.

Every test works on tables with a prefix of its own (``mig_<random>_``) and drops them afterwards,
so the shared ``dbqt_`` tables of the contract suite are never touched.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from support.backends import PREFIX, drop_queue_tables

import dbqueue
from dbqueue.migrations import migrate
from dbqueue.schema.tables import tables_for

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PG_SCHEMA = f"dbqueue_mig_{PREFIX.rstrip('_')}"


def own_prefix(tag: str = "mig") -> str:
    return f"{tag}_{secrets.token_hex(3)}_"


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a subprocess, without settings that would override the command line
    or point Python at the checkout."""
    dropped = ("DBQUEUE_", "DB_", "DATABASE_", "QUEUE_")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(dropped) and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update(extra)
    return env


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 120):
    result = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result


def describe(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def has_table(engine: sa.Engine, name: str, schema: str | None = None) -> bool:
    return sa.inspect(engine).has_table(name, schema=schema)


def pg_function_exists(engine: sa.Engine, name: str, schema: str | None = None) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                    "WHERE p.proname = :name AND n.nspname = coalesce(:schema, current_schema())"
                ),
                {"name": name, "schema": schema},
            ).scalar()
        )


def count_jobs(app: dbqueue.App, engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(app.tables.jobs)).scalar_one()


@dataclass
class Own:
    """An App on a prefix of its own in one test database, and an engine on it."""

    app: dbqueue.App
    engine: sa.Engine
    prefix: str

    @property
    def names(self):
        return self.app.names


def _own(url: str, tag: str = "mig") -> Own:
    prefix = own_prefix(tag)
    app = dbqueue.App(url, table_prefix=prefix)
    return Own(app, app.create_engine(), prefix)


def _drop(own: Own) -> None:
    try:
        drop_queue_tables(own.engine, own.prefix)
    finally:
        own.engine.dispose()
        own.app.engine.dispose()


@pytest.fixture
def own(database) -> Iterator[Own]:
    """Fresh, unmigrated tables names on each database; dropped at the end, pass or fail."""
    queue = _own(database.url)
    try:
        yield queue
    finally:
        _drop(queue)


@pytest.fixture
def two_own(database) -> Iterator[tuple[Own, Own]]:
    first, second = _own(database.url, "miga"), _own(database.url, "migb")
    try:
        yield first, second
    finally:
        try:
            _drop(first)
        finally:
            _drop(second)


# ---- up, down, up ----------------------------------------------------------------------------
def test_upgrade_downgrade_upgrade_round_trip(own):
    engine, names = own.engine, own.names
    head = migrate.head_revision()
    postgresql = engine.dialect.name == "postgresql"

    for round_trip in (1, 2):
        migrate.upgrade(engine, names)
        assert has_table(engine, names.jobs), f"round {round_trip}: no {names.jobs}"
        assert has_table(engine, names.maintenance)
        assert has_table(engine, names.subscriptions)
        assert has_table(engine, names.version_table)
        assert names.version_table == f"{names.jobs}_alembic"
        if postgresql:
            assert pg_function_exists(engine, f"{names.jobs}_notify")
        with engine.connect() as conn:
            assert migrate.current_revision(conn, names) == head
            migrate.check_schema(conn, names)  # raises if anything is off
            versions = conn.execute(
                sa.text(f"SELECT version_num FROM {names.version_table}")
            ).scalars()
            assert list(versions) == [head]

        # Upgrading a database already at head changes nothing and does not fail.
        migrate.upgrade(engine, names)
        with engine.connect() as conn:
            assert migrate.current_revision(conn, names) == head

        migrate.downgrade(engine, names, "base")
        assert not has_table(engine, names.jobs), f"round {round_trip}: {names.jobs} survived"
        assert not has_table(engine, names.maintenance)
        assert not has_table(engine, names.subscriptions)
        if postgresql:
            assert not pg_function_exists(engine, f"{names.jobs}_notify")
        with engine.connect() as conn:
            assert migrate.current_revision(conn, names) is None
            with pytest.raises(dbqueue.SchemaMissingError) as missing:
                migrate.check_schema(conn, names)
        assert "dbqueue migrate" in str(missing.value)
        assert names.jobs in str(missing.value)

    # The tables that come back after two round trips work.
    migrate.upgrade(engine, names)
    job_id = own.app.enqueue(engine, "after_round_trips", {"n": 1})
    job = own.app.get_job(job_id, engine)
    assert job["payload"] == {"n": 1} and job["status"] == "available"


def test_check_schema_reports_an_older_migration(own):
    engine, names = own.engine, own.names
    migrate.upgrade(engine, names)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {names.version_table} SET version_num = '0000'"))
    with engine.connect() as conn:
        assert migrate.current_revision(conn, names) == "0000"
        with pytest.raises(dbqueue.SchemaMissingError) as outdated:
            migrate.check_schema(conn, names)
    message = str(outdated.value)
    assert "0000" in message, message
    assert "dbqueue migrate" in message, message
    assert migrate.head_revision() in message, message


# ---- migrations == Table definitions ---------------------------------------------------------
def reflected_shape(inspector, table: str, schema: str | None) -> dict:
    columns = inspector.get_columns(table, schema=schema)
    return {
        "columns": [(c["name"], bool(c["nullable"])) for c in columns],
        "primary_key": inspector.get_pk_constraint(table, schema=schema)["constrained_columns"],
        "indexes": {
            i["name"]: (list(i["column_names"]), bool(i["unique"]))
            for i in inspector.get_indexes(table, schema=schema)
        },
    }


def declared_shape(table: sa.Table) -> dict:
    return {
        "columns": [(c.name, bool(c.nullable)) for c in table.columns],
        "primary_key": [c.name for c in table.primary_key.columns],
        "indexes": {i.name: ([c.name for c in i.columns], bool(i.unique)) for i in table.indexes},
    }


def test_migrations_create_exactly_the_declared_tables(own):
    engine, names = own.engine, own.names
    migrate.upgrade(engine, names)
    metadata = tables_for(names).metadata
    ours = {t.name for t in metadata.tables.values()}
    assert ours == set(names.all)

    def include_name(name, type_, parent_names):
        # Only this queue's tables: the database holds other queues' and other tests' tables.
        return type_ != "table" or name in ours

    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "version_table": names.version_table,
                "include_name": include_name,
                "compare_type": True,
                # Server-default comparison is text-based and reports MariaDB's '0' for
                # sa.false() as a change; defaults are exercised by the enqueue tests instead.
                "compare_server_default": False,
            },
        )
        diff = compare_metadata(context, metadata)
        diff = [d for d in diff if names.version_table not in repr(d)]
        assert diff == [], (
            f"migrations differ from dbqueue/schema/tables.py on {engine.dialect.name}"
        )

        inspector = sa.inspect(conn)
        for table in metadata.tables.values():
            reflected = reflected_shape(inspector, table.name, names.schema)
            declared = declared_shape(table)
            assert reflected["columns"] == declared["columns"], table.name
            assert reflected["primary_key"] == declared["primary_key"], table.name
            assert reflected["indexes"] == declared["indexes"], table.name

    jobs = declared_shape(tables_for(names).jobs)
    assert jobs["indexes"][f"{names.jobs}_claim"] == (
        ["status", "queue", "priority", "run_at", "id"],
        False,
    )
    assert set(jobs["indexes"]) == {
        f"{names.jobs}_claim",
        f"{names.jobs}_finished",
        f"{names.jobs}_equivalent",
        f"{names.jobs}_key",
    }
    # No foreign key, unique key or trigger on the subscriptions table (SingleStore has none).
    subscriptions = declared_shape(tables_for(names).subscriptions)
    assert subscriptions["primary_key"] == ["id"]
    assert subscriptions["indexes"] == {f"{names.subscriptions}_topic": (["topic"], False)}
    assert not tables_for(names).subscriptions.foreign_keys


def test_downgrading_0003_drops_only_the_subscriptions_table(own):
    engine, names = own.engine, own.names
    migrate.upgrade(engine, names)
    own.app.add_subscription(engine, "crm", "order.paid")
    job_id = own.app.enqueue(engine, "kept", {"n": 1})

    migrate.downgrade(engine, names, "0002")
    assert not has_table(engine, names.subscriptions)
    assert has_table(engine, names.jobs) and has_table(engine, names.maintenance)
    jobs = own.app.tables.jobs
    with engine.connect() as conn:  # the columns 0002 has (get_job reads today's)
        kept = sa.select(jobs.c.payload).where(jobs.c.id == job_id)
        assert conn.execute(kept).scalar_one() == {"n": 1}
        assert migrate.current_revision(conn, names) == "0002"
        with pytest.raises(dbqueue.SchemaMissingError) as outdated:
            migrate.check_schema(conn, names)
    assert "dbqueue migrate" in str(outdated.value)
    with pytest.raises(dbqueue.SchemaMissingError) as missing:
        own.app.publish(engine, "order.paid", {})
    assert names.subscriptions in str(missing.value) and "dbqueue migrate" in str(missing.value)

    migrate.upgrade(engine, names)
    assert own.app.subscriptions(target=engine) == []
    own.app.add_subscription(engine, "crm", "order.paid")
    publication = own.app.publish(engine, "order.paid", {"n": 2})
    assert own.app.get_job(publication, engine)["message"].endswith(": crm")


# ---- several queues in one database ----------------------------------------------------------
def test_two_prefixes_are_independent_queues(two_own):
    first, second = two_own
    migrate.upgrade(first.engine, first.names)
    migrate.upgrade(second.engine, second.names)
    assert first.names.version_table != second.names.version_table

    ids = first.app.enqueue_many(
        first.engine, [{"task": "t", "payload": {"n": n}} for n in range(3)]
    )
    assert count_jobs(first.app, first.engine) == 3
    assert count_jobs(second.app, second.engine) == 0
    if ids:  # databases whose multi-row INSERT returns ids
        assert all(second.app.get_job(i, second.engine) is None for i in ids)

    migrate.downgrade(first.engine, first.names, "base")
    assert not has_table(first.engine, first.names.jobs)
    assert not has_table(first.engine, first.names.maintenance)
    assert not has_table(first.engine, first.names.subscriptions)
    for table in (
        second.names.jobs,
        second.names.maintenance,
        second.names.subscriptions,
        second.names.version_table,
    ):
        assert has_table(second.engine, table), f"downgrading {first.prefix} dropped {table}"
    with second.engine.connect() as conn:
        assert migrate.current_revision(conn, second.names) == migrate.head_revision()
        migrate.check_schema(conn, second.names)
    with first.engine.connect() as conn, pytest.raises(dbqueue.SchemaMissingError):
        migrate.check_schema(conn, first.names)

    # The surviving queue still takes jobs (on PostgreSQL: its own NOTIFY trigger still fires).
    job_id = second.app.enqueue(second.engine, "t", {"still": "here"})
    assert second.app.get_job(job_id, second.engine)["payload"] == {"still": "here"}


def test_a_postgresql_schema_holds_a_queue(postgresql):
    admin = sa.create_engine(postgresql.url)
    with admin.begin() as conn:
        conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {PG_SCHEMA} CASCADE"))
        conn.execute(sa.text(f"CREATE SCHEMA {PG_SCHEMA}"))
    app = dbqueue.App(postgresql.url, schema=PG_SCHEMA, table_prefix=own_prefix())
    names = app.names
    try:
        app.migrate()
        for table in (*names.all, names.version_table):
            assert has_table(admin, table, schema=PG_SCHEMA), table
            assert not has_table(admin, table), f"{table} leaked into the default schema"
        assert pg_function_exists(admin, f"{names.jobs}_notify", PG_SCHEMA)
        with app.engine.connect() as conn:
            assert migrate.current_revision(conn, names) == migrate.head_revision()
            migrate.check_schema(conn, names)

        job_id = app.enqueue(None, "in_schema", {"schema": PG_SCHEMA})
        job = app.get_job(job_id)
        assert job is not None
        assert job["id"] == job_id and job["task"] == "in_schema"
        assert job["payload"] == {"schema": PG_SCHEMA}
        with admin.connect() as conn:
            stored = conn.execute(
                sa.text(f"SELECT task FROM {PG_SCHEMA}.{names.jobs} WHERE id = :id"),
                {"id": job_id},
            ).scalar_one()
        assert stored == "in_schema"

        app.add_subscription(None, "in_schema", "in_schema")
        publication = app.publish(None, "in_schema", {})
        assert app.get_job(publication)["message"].endswith(": in_schema")

        migrate.downgrade(app.engine, names, "base")
        assert not has_table(admin, names.jobs, schema=PG_SCHEMA)
        assert not has_table(admin, names.subscriptions, schema=PG_SCHEMA)
        assert not pg_function_exists(admin, f"{names.jobs}_notify", PG_SCHEMA)
    finally:
        app.engine.dispose()
        with admin.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {PG_SCHEMA} CASCADE"))
        admin.dispose()


# ---- command-line entry points ---------------------------------------------------------------
@pytest.mark.parametrize("target", ["sqlite", "postgresql"])
def test_alembic_upgrade_head_from_the_checkout(target, request, tmp_path):
    if target == "sqlite":
        url = f"sqlite:///{tmp_path / 'alembic.db'}"
    else:
        url = request.getfixturevalue("postgresql").url
    queue = _own(url, "mal")
    names = queue.names
    alembic = [BIN / "alembic", "-c", "alembic.ini", "-x", f"url={url}", "-x"]
    alembic += [f"prefix={queue.prefix}"]
    try:
        up = run([*alembic, "upgrade", "head"], cwd=ROOT)
        assert up.returncode == 0, describe(up)
        assert has_table(queue.engine, names.jobs)
        assert has_table(queue.engine, names.maintenance)
        assert has_table(queue.engine, names.subscriptions)
        assert has_table(queue.engine, names.version_table)
        with queue.engine.connect() as conn:
            assert migrate.current_revision(conn, names) == migrate.head_revision()
            migrate.check_schema(conn, names)

        down = run([*alembic, "downgrade", "base"], cwd=ROOT)
        assert down.returncode == 0, describe(down)
        assert not has_table(queue.engine, names.jobs)
        assert not has_table(queue.engine, names.maintenance)
        with queue.engine.connect() as conn:
            assert migrate.current_revision(conn, names) is None
    finally:
        _drop(queue)


def test_dbqueue_migrate_show_and_downgrade(own, tmp_path):
    engine, names = own.engine, own.names
    head = migrate.head_revision()
    dbqueue_cli = [BIN / "dbqueue", "migrate", "--url", own.app.url, "--table-prefix", own.prefix]
    elsewhere = tmp_path

    show = run([*dbqueue_cli, "--show"], cwd=elsewhere)
    assert show.returncode == 0, describe(show)
    assert "current: none" in show.stdout and f"latest: {head}" in show.stdout, show.stdout
    assert not has_table(engine, names.jobs), "--show must change nothing"

    up = run(dbqueue_cli, cwd=elsewhere)
    assert up.returncode == 0, describe(up)
    assert names.jobs in up.stdout
    assert has_table(engine, names.jobs) and has_table(engine, names.version_table)

    show = run([*dbqueue_cli, "--show"], cwd=elsewhere)
    assert show.returncode == 0, describe(show)
    assert f"current: {head}" in show.stdout and f"latest: {head}" in show.stdout, show.stdout

    down = run([*dbqueue_cli, "--downgrade"], cwd=elsewhere)
    assert down.returncode == 0, describe(down)
    assert "downgraded" in down.stdout
    assert not has_table(engine, names.jobs)
    assert not has_table(engine, names.maintenance)
    with engine.connect() as conn:
        assert migrate.current_revision(conn, names) is None

    show = run([*dbqueue_cli, "--show"], cwd=elsewhere)
    assert "current: none" in show.stdout, describe(show)


@pytest.mark.slow
def test_dbqueue_migrate_from_an_installed_wheel(tmp_path):
    dist = tmp_path / "dist"
    build_dir_existed = (ROOT / "build").exists()
    try:
        built = run(
            [sys.executable, "-m", "build", "--wheel", "--outdir", dist],
            cwd=ROOT,
            env=clean_env(),
            timeout=300,
        )
    finally:
        if not build_dir_existed:  # setuptools' scratch folder; leave the checkout as found
            shutil.rmtree(ROOT / "build", ignore_errors=True)
    assert built.returncode == 0, describe(built)
    (wheel,) = dist.glob("dbqueue_sql-*.whl")

    venv = tmp_path / "venv"
    made = run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    assert made.returncode == 0, describe(made)
    installed = run(
        [venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel],
        cwd=tmp_path,
        timeout=300,
    )
    assert installed.returncode == 0, describe(installed)

    elsewhere = tmp_path / "elsewhere"  # not the checkout: nothing to import from by accident
    elsewhere.mkdir()
    database = tmp_path / "fresh.db"
    migrated = run(
        [venv / "bin" / "dbqueue", "migrate", "--url", f"sqlite:///{database}"], cwd=elsewhere
    )
    assert migrated.returncode == 0, describe(migrated)
    with sqlite3.connect(database) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        versions = [r[0] for r in db.execute("SELECT version_num FROM dbqueue_jobs_alembic")]
    assert {
        "dbqueue_jobs",
        "dbqueue_jobs_alembic",
        "dbqueue_jobs_maintenance",
        "dbqueue_subscriptions",
    } <= tables
    assert versions == [migrate.head_revision()]

    probe = (
        "import json, site, dbqueue, dbqueue.migrate as m;"
        "print(json.dumps({'package': dbqueue.__file__, 'migrations': str(m.MIGRATIONS_DIR),"
        " 'versions': sorted(p.name for p in (m.MIGRATIONS_DIR / 'versions').glob('*.py')),"
        " 'head': m.head_revision(), 'site': site.getsitepackages()}))"
    )
    where = run([venv / "bin" / "python", "-c", probe], cwd=elsewhere)
    assert where.returncode == 0, describe(where)
    found = json.loads(where.stdout)
    migrations = Path(found["migrations"]).resolve()
    site_packages = [Path(p).resolve() for p in found["site"]]
    assert any(migrations.is_relative_to(p) for p in site_packages), found
    assert migrations.is_relative_to(venv.resolve()), found
    assert not migrations.is_relative_to(ROOT), found
    assert not Path(found["package"]).resolve().is_relative_to(ROOT), found
    assert found["head"] == migrate.head_revision()
    checkout_versions = sorted(p.name for p in (migrate.MIGRATIONS_DIR / "versions").glob("*.py"))
    assert found["versions"] == checkout_versions

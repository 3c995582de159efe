"""dbqueue in an application's own Alembic project, wired as the README says.

Each test builds the application's project in tmp_path — ``alembic init``, a model with one table
of the user's, env.py given ``dbqueue.alembic.include_object``, a revision of the user's calling
``dbqueue.alembic.upgrade`` — and runs the ``alembic`` command in a subprocess, as a user would.

Autogenerate compares the model with every table of the database, so on PostgreSQL and MariaDB
the project gets a database of its own, created and dropped here (the shared ``test`` database
holds other suites' tables, which come and go while autogenerate reflects them); on SQLite a file
of its own. Its queue and user tables also carry a prefix of their own (``alb_<random>_``).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.backends import Backend

import dbqueue
import dbqueue.alembic
from dbqueue.migrations import migrate
from dbqueue.schema.tables import TableNames, tables_for

BIN = Path(sys.executable).parent
MODEL = """\
import sqlalchemy as sa

metadata = sa.MetaData()
orders = sa.Table(
    "{prefix}orders",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("status", sa.String(20), nullable=False),
    mysql_engine="InnoDB",
)
"""
# What the README tells users to put into env.py.
ENV_IMPORTS = (
    "import dbqueue.alembic\nfrom myapp.models import metadata\n\ntarget_metadata = metadata"
)
ENV_FILTER = "context.configure(\n        include_object=dbqueue.alembic.include_object,"
# ... and into a revision of their own.
QUEUE_UPGRADE = 'dbqueue.alembic.upgrade(op, "{prefix}", "{revision}")'
QUEUE_DOWNGRADE = 'dbqueue.alembic.downgrade(op, "{prefix}", "base")'


@dataclass
class Project:
    """A user's Alembic project in ``root``, on a database of its own at ``url``."""

    root: Path
    url: str
    prefix: str
    backend: Backend

    @property
    def names(self) -> TableNames:
        return TableNames.resolve(self.prefix)

    @property
    def orders(self) -> str:
        return f"{self.prefix}orders"

    def run(self, *args: object, check: bool = True) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DBQUEUE_", "DB_"))}
        env.pop("PYTHONPATH", None)
        done = subprocess.run(
            [str(a) for a in args], cwd=self.root, env=env, capture_output=True, text=True
        )
        if check:
            assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stderr}"
        return done

    def alembic(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run(sys.executable, "-m", "alembic", *args, check=check)

    def revision(self, message: str, *, autogenerate: bool = False) -> Path:
        options = ["--autogenerate"] if autogenerate else []
        self.alembic("revision", *options, "-m", message)
        (path,) = (self.root / "migrations" / "versions").glob(f"*_{message}.py")
        return path

    def queue_revision(self, revision: str = "head") -> Path:
        """A revision of the user's that brings the queue's tables in, as the README shows."""
        if revision == "head":
            revision = migrate.head_revision()
        path = self.revision("queue_tables")
        text = path.read_text().replace("import sqlalchemy as sa", "import dbqueue.alembic", 1)
        bodies = iter(
            [
                QUEUE_UPGRADE.format(prefix=self.prefix, revision=revision),
                QUEUE_DOWNGRADE.format(prefix=self.prefix),
            ]
        )
        text, filled = re.subn(r"(?m)^    pass$", lambda _: f"    {next(bodies)}", text)
        assert filled == 2, text
        path.write_text(text)
        return path

    def engine(self) -> sa.Engine:
        return sa.create_engine(self.url, poolclass=sa.NullPool)

    def user_versions(self) -> list[str]:
        engine = self.engine()
        try:
            with engine.connect() as conn:
                rows = conn.execute(sa.text("SELECT version_num FROM alembic_version"))
                return sorted(rows.scalars())
        finally:
            engine.dispose()

    def queue_revision_in_database(self) -> str | None:
        engine = self.engine()
        try:
            with engine.connect() as conn:
                return migrate.current_revision(conn, self.names)
        finally:
            engine.dispose()

    def tables(self) -> set[str]:
        engine = self.engine()
        try:
            return set(sa.inspect(engine).get_table_names())
        finally:
            engine.dispose()

    def app(self) -> dbqueue.App:
        options = {"lock_server": self.backend.server} if self.backend.server else {}
        return dbqueue.App(self.url, table_prefix=self.prefix, **options)


@contextlib.contextmanager
def private_database(backend: Backend, name: str, sqlite_file: Path) -> Iterator[str]:
    url = sa.engine.make_url(backend.url)
    if url.get_backend_name() == "sqlite":
        yield f"sqlite:///{sqlite_file}"
        return
    # PostgreSQL runs CREATE DATABASE only outside a transaction; MySQL commits DDL anyway.
    autocommit = {"isolation_level": "AUTOCOMMIT"} if url.get_backend_name() == "postgresql" else {}
    admin = sa.create_engine(url, poolclass=sa.NullPool, **autocommit)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f"CREATE DATABASE {name}"))
        try:
            yield url.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.begin() as conn:
                conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name}"))
    finally:
        admin.dispose()


#: The user's Alembic project on each database server. Not on the SingleStore path: here it runs
#: on MariaDB with MySQL's DDL, which the mysql case already covers (tests/test_migrations.py
#: runs dbqueue's own migrations on that path).
ON_EACH_SERVER = pytest.mark.parametrize(
    "database", ["mysql", "postgresql", "sqlite"], indirect=True
)


@pytest.fixture
def project(database: Backend, tmp_path: Path) -> Iterator[Project]:
    tag = f"alb_{secrets.token_hex(3)}"
    with private_database(database, tag, tmp_path / "app.db") as url:
        root = tmp_path / "project"
        root.mkdir()
        made = Project(root, url, f"{tag}_", database)
        made.alembic("init", "migrations")
        ini = root / "alembic.ini"
        ini.write_text(
            re.sub(r"(?m)^sqlalchemy\.url = .*$", f"sqlalchemy.url = {url}", ini.read_text())
        )
        (root / "myapp").mkdir()
        (root / "myapp" / "__init__.py").write_text("")
        (root / "myapp" / "models.py").write_text(MODEL.format(prefix=made.prefix))
        env_py = root / "migrations" / "env.py"
        text = env_py.read_text()
        assert text.count("target_metadata = None") == 1 and text.count("context.configure(") == 2
        text = text.replace("target_metadata = None", ENV_IMPORTS)
        env_py.write_text(text.replace("context.configure(", ENV_FILTER))
        yield made


def dbqueue_names_in(text: str, names: TableNames) -> list[str]:
    tables = (*names.all, names.version_table)
    return [t for t in tables if re.search(rf"['\"]{t}['\"]", text)]


# ---- autogenerate ----------------------------------------------------------------------------
@ON_EACH_SERVER
def test_autogenerate_leaves_existing_queue_tables_alone(project):
    # Queues made outside the user's history: one by `dbqueue migrate`, one with explicit names.
    project.run(BIN / "dbqueue", "migrate", "--url", project.url, "--table-prefix", project.prefix)
    other = TableNames(jobs=f"{project.prefix}work", subscriptions=f"{project.prefix}subs")
    engine = project.engine()
    try:
        migrate.upgrade(engine, other)
    finally:
        engine.dispose()
    assert {project.names.jobs, other.jobs, other.version_table} <= project.tables()

    text = project.revision("orders", autogenerate=True).read_text()
    assert f"op.create_table('{project.orders}'" in text, text
    assert dbqueue_names_in(text, project.names) == [], text
    assert dbqueue_names_in(text, other) == [], text
    assert "drop_table" not in text.split("def downgrade")[0], text

    project.alembic("upgrade", "head")
    check = project.alembic("check")  # the model and the database now agree, queues aside
    assert "No new upgrade operations detected" in check.stdout + check.stderr


# ---- upgrade, worker, downgrade ----------------------------------------------------------------
@ON_EACH_SERVER
def test_upgrade_head_brings_the_queue_in_its_own_version_table(project):
    project.revision("orders", autogenerate=True)
    queue_revision = project.queue_revision()
    project.alembic("upgrade", "head")

    head = migrate.head_revision()
    assert project.queue_revision_in_database() == head
    engine = project.engine()
    try:
        with engine.connect() as conn:
            migrate.check_schema(conn, project.names)
    finally:
        engine.dispose()
    (user_head,) = project.user_versions()
    assert queue_revision.name.startswith(user_head), "the user's table holds the user's head"
    assert project.alembic("current").stdout.split()[0] == user_head

    # Twice is a no-op, and `dbqueue migrate` finds nothing to do.
    again = project.alembic("upgrade", "head")
    assert "Running upgrade" not in again.stderr, again.stderr
    cli = project.run(
        BIN / "dbqueue", "migrate", "--url", project.url, "--table-prefix", project.prefix
    )
    assert "Running upgrade" not in cli.stdout + cli.stderr, cli.stderr
    assert project.queue_revision_in_database() == head
    assert project.user_versions() == [user_head]

    run_a_job(project)


def run_a_job(project: Project) -> None:
    """A worker on the queue the user's history made runs a job that writes the user's table."""
    orders = tables_for_orders(project)
    app = project.app()
    try:

        @app.task("ship")
        def ship(job, session):
            session.execute(
                orders.update().where(orders.c.id == job.payload["order"]).values(status="shipped")
            )

        with app.engine.begin() as conn:
            conn.execute(orders.insert().values(id=7, status="paid"))
            job_id = app.enqueue(conn, "ship", {"order": 7})
        summary = app.run_worker(burst=True)
        assert summary.succeeded == 1, summary
        assert app.get_job(job_id)["status"] == "succeeded"
        with app.engine.connect() as conn:
            assert conn.execute(sa.select(orders.c.status)).scalar_one() == "shipped"
    finally:
        app.engine.dispose()


def tables_for_orders(project: Project) -> sa.Table:
    return sa.Table(
        project.orders,
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("status", sa.String(20)),
    )


@ON_EACH_SERVER
def test_downgrading_the_users_revision_drops_the_queue_tables(project):
    project.revision("orders", autogenerate=True)
    project.queue_revision()
    project.alembic("upgrade", "head")
    names = project.names

    project.alembic("downgrade", "-1")  # the queue's revision only
    left = project.tables()
    assert project.orders in left
    assert not set(names.all) & left, left
    assert project.queue_revision_in_database() is None
    assert len(project.user_versions()) == 1

    project.alembic("upgrade", "head")  # and back
    assert project.queue_revision_in_database() == migrate.head_revision()
    project.alembic("downgrade", "base")
    assert project.orders not in project.tables()
    assert project.user_versions() == []


@pytest.mark.parametrize("database", ["postgresql"], indirect=True)
def test_on_postgresql_the_queue_tables_share_the_runs_transaction(project):
    project.revision("orders", autogenerate=True)
    project.queue_revision()
    failing = project.revision("fails_later")
    failing.write_text(
        failing.read_text().replace("    pass", "    raise RuntimeError('later')", 1)
    )

    failed = project.alembic("upgrade", "head", check=False)
    assert failed.returncode != 0 and "later" in failed.stderr, failed.stderr
    # Alembic keeps its own (empty) version table; the queue's and the user's tables went.
    assert project.tables() - {"alembic_version"} == set(), "tables survived the rollback"
    assert project.user_versions() == []


# ---- what goes wrong, said clearly -------------------------------------------------------------
@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
def test_offline_sql_mode_says_how_to_get_the_queue_ddl(project):
    project.revision("orders", autogenerate=True)
    project.queue_revision()
    offline = project.alembic("upgrade", "head", "--sql", check=False)
    assert offline.returncode != 0
    assert "dbqueue migrate --sql" in offline.stderr, offline.stderr
    assert project.names.jobs in offline.stderr


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
def test_dbqueue_versions_in_the_users_version_locations_are_refused(project):
    project.revision("orders", autogenerate=True)
    ini = project.root / "alembic.ini"
    versions = migrate.MIGRATIONS_DIR / "versions"
    ini.write_text(
        ini.read_text().replace(
            "[alembic]\n",
            f"[alembic]\nversion_locations = %(here)s/migrations/versions{os.pathsep}{versions}\n",
            1,
        )
    )
    refused = project.alembic("upgrade", "heads", check=False)
    assert refused.returncode != 0
    assert "dbqueue.alembic.upgrade(op" in refused.stderr, refused.stderr
    assert "0001" not in project.user_versions()


# ---- the pieces, without a project --------------------------------------------------------------
def reflected_copy(table: sa.Table) -> sa.Table:
    """``table`` as autogenerate sees it in the database: its columns, no marker."""
    copy = table.to_metadata(sa.MetaData())
    copy.info.clear()
    return copy


@pytest.mark.parametrize("names", [TableNames.resolve("any_"), TableNames("work", "subs", None)])
def test_include_object_recognises_queue_tables_of_any_names(names):
    tables = tables_for(names)
    version = sa.Table(names.version_table, sa.MetaData(), sa.Column("version_num", sa.String(32)))
    for table in (tables.jobs, tables.maintenance, tables.subscriptions, version):
        found = reflected_copy(table) if table is not version else version
        assert not dbqueue.alembic.include_object(found, found.name, "table", True, None), found
    for table in (tables.jobs, tables.maintenance, tables.subscriptions):
        # dbqueue's own Table objects, should an application add them to its MetaData.
        assert not dbqueue.alembic.include_object(table, table.name, "table", False, None)
        column = table.columns["id" if table is not tables.maintenance else "routine"]
        assert not dbqueue.alembic.include_object(column, column.name, "column", False, None)


def test_include_object_keeps_the_applications_tables():
    jobs = reflected_copy(tables_for(TableNames.resolve("app_")).jobs)
    # A table of the application's own model is never skipped, even one shaped like dbqueue's.
    assert dbqueue.alembic.include_object(jobs, jobs.name, "table", False, None)
    metadata = sa.MetaData()
    for table in (
        sa.Table("newsletter_subscriptions", metadata, sa.Column("id", sa.Integer)),
        sa.Table("print_jobs", metadata, sa.Column("id", sa.Integer), sa.Column("task", sa.Text)),
        sa.Table("nightly_maintenance", metadata, sa.Column("routine", sa.Text)),
        sa.Table(
            "old_alembic", metadata, sa.Column("version_num", sa.Text), sa.Column("x", sa.Text)
        ),
    ):
        assert dbqueue.alembic.include_object(table, table.name, "table", True, None), table.name

    seen = []

    def users_hook(object_, name, type_, reflected, compare_to):
        seen.append(name)
        return name != "skipped_by_the_user"

    combined = dbqueue.alembic.include_object_with(users_hook)
    queue_jobs = reflected_copy(tables_for(TableNames.resolve("q_")).jobs)
    assert not combined(queue_jobs, queue_jobs.name, "table", True, None)
    assert combined(jobs, jobs.name, "table", False, None)
    assert not combined(jobs, "skipped_by_the_user", "table", False, None)
    assert seen == [jobs.name, "skipped_by_the_user"]


def test_upgrade_and_downgrade_leave_a_queue_past_their_revision_alone(tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'q.db'}")
    names = TableNames.resolve("q_")
    try:
        dbqueue.alembic.downgrade(engine, "q_", "base")  # no tables yet: nothing to do
        dbqueue.alembic.upgrade(engine, "q_")
        with engine.connect() as conn:
            assert migrate.current_revision(conn, names) == migrate.head_revision()
        dbqueue.alembic.upgrade(engine, names, "0001")  # pinned below the queue: no change
        dbqueue.alembic.downgrade(engine, names, "0001")
        dbqueue.alembic.downgrade(engine, names, "0002")  # already below: no change, no error
        with engine.begin() as conn:
            assert migrate.current_revision(conn, names) == "0001"
            dbqueue.alembic.upgrade(conn, names, "0002")
            assert migrate.current_revision(conn, names) == "0002"
        with pytest.raises(dbqueue.ConfigurationError, match="App, a TableNames or a table prefix"):
            dbqueue.alembic.upgrade(engine, 42)
    finally:
        engine.dispose()

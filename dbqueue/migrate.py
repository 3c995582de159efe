"""Schema migrations: Alembic, shipped inside the package, one version table per queue.

The same revisions run from ``alembic upgrade head`` in a checkout (``alembic/env.py``) and from
``dbqueue migrate`` / ``App.migrate()`` in an installed wheel (``dbqueue/migrations/env.py``).
Each queue (table prefix or explicit names) keeps its own version table, ``<jobs table>_alembic``,
so several queues in one database, and the application's own Alembic history, never collide.
"""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

from . import dialects
from .config import Settings, resolve_url
from .errors import SchemaMissingError
from .schema import TableNames, tables_for

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config(names: TableNames, connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["dbqueue_names"] = names
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    heads = ScriptDirectory(str(MIGRATIONS_DIR)).get_heads()
    assert len(heads) == 1, f"dbqueue's migrations must have one head, found {heads}"
    return heads[0]


def upgrade(bind: Engine | Connection, names: TableNames, revision: str = "head") -> None:
    _run(command.upgrade, bind, names, revision)


def upgrade_sql(url: str, names: TableNames, revision: str = "head") -> str:
    """The SQL ``upgrade`` would run on a database of ``url``'s kind, without connecting
    (Alembic's offline mode): to review the DDL, or to hand it to a DBA."""
    buffer = io.StringIO()
    cfg = alembic_config(names)
    cfg.output_buffer = buffer
    cfg.attributes["offline_url"] = url
    command.upgrade(cfg, revision, sql=True)
    return buffer.getvalue()


def downgrade(bind: Engine | Connection, names: TableNames, revision: str = "base") -> None:
    _run(command.downgrade, bind, names, revision)


def _run(step: Any, bind: Engine | Connection, names: TableNames, revision: str) -> None:
    if isinstance(bind, Connection):
        step(alembic_config(names, bind), revision)
        return
    with bind.begin() as conn:
        step(alembic_config(names, conn), revision)


def current_revision(conn: Connection, names: TableNames) -> str | None:
    # Alembic logs its set-up at INFO; a read of the version table is not worth those lines.
    alembic_log = logging.getLogger("alembic.runtime.migration")
    level = alembic_log.level
    alembic_log.setLevel(logging.WARNING)
    try:
        context = MigrationContext.configure(
            conn,
            opts={"version_table": names.version_table, "version_table_schema": names.schema},
        )
        return context.get_current_revision()
    finally:
        alembic_log.setLevel(level)


def check_schema(conn: Connection, names: TableNames) -> None:
    """Refuse to run against missing or outdated tables, saying how to fix it."""
    where = f" (schema {names.schema!r})" if names.schema else ""
    try:
        revision = current_revision(conn, names)
        conn.rollback()
    except sa.exc.DBAPIError as exc:
        if dialects.for_sqlalchemy(conn.dialect).is_missing_table(exc):
            revision = None
            conn.rollback()
        else:
            raise
    head = head_revision()
    if revision is None:
        raise SchemaMissingError(
            f"the queue tables for {names.jobs!r}{where} do not exist in this database: "
            "run `dbqueue migrate` (same URL and table prefix) to create them"
        )
    if revision != head:
        raise SchemaMissingError(
            f"the queue tables for {names.jobs!r}{where} are at migration {revision}, but this "
            f"version of dbqueue needs {head}: run `dbqueue migrate` to upgrade them"
        )


# ---- the Alembic environment (called from both env.py files) ---------------------------------
def run_migrations(context: Any) -> None:
    """Body of env.py: migrate the connection and table names passed in, or those from
    ``-x url=… -x prefix=… -x schema=…`` / the environment when run by the alembic command."""
    config = context.config
    names = config.attributes.get("dbqueue_names")
    connection = config.attributes.get("connection")
    xargs = context.get_x_argument(as_dictionary=True)
    if names is None:
        settings = Settings.from_env()
        names = TableNames.resolve(
            xargs.get("prefix", settings.table_prefix),
            xargs.get("schema", settings.schema),
            xargs.get("jobs_table", settings.jobs_table),
            xargs.get("subscriptions_table", settings.subscriptions_table),
        )
    if connection is not None:
        _migrate(context, connection, names)
        return
    url = config.attributes.get("offline_url") or xargs.get("url")
    url = url or config.get_main_option("sqlalchemy.url") or None
    url = resolve_url(url, xargs.get("dialect") or os.environ.get("DBQUEUE_DIALECT"))
    if context.is_offline_mode():
        _migrate_offline(context, url, names)
        return
    from .app import App

    engine = App(url).create_engine()
    try:
        with engine.begin() as conn:
            _migrate(context, conn, names)
    finally:
        engine.dispose()


def _version_options(names: TableNames, dialect: dialects.Dialect) -> dict[str, Any]:
    """What online and offline (--sql) runs both tell Alembic: this queue's tables and its own
    version table, and how the database alters tables."""
    return {
        "target_metadata": tables_for(names).metadata,
        "version_table": names.version_table,
        "version_table_schema": names.schema,
        "version_table_pk": dialect.version_table_pk,
        "render_as_batch": dialect.needs_batch_alter,
    }


def _migrate(context: Any, connection: Connection, names: TableNames) -> None:
    dialect = dialects.for_sqlalchemy(connection.dialect)
    context.configure(connection=connection, **_version_options(names, dialect))
    with context.begin_transaction():
        context.run_migrations(names=names)


def _migrate_offline(context: Any, url: str, names: TableNames) -> None:
    parsed = dialects.class_for_url(sa.engine.make_url(url)).normalize_url(sa.engine.make_url(url))
    dialect = dialects.for_sqlalchemy(parsed.get_dialect()())
    context.configure(
        dialect_name=parsed.get_backend_name(),
        url=parsed,
        literal_binds=True,
        **_version_options(names, dialect),
    )
    with context.begin_transaction():
        context.run_migrations(names=names)


def table_options(key: str) -> dict[str, Any]:
    """For migration scripts: CREATE TABLE options of the database being migrated (engine and
    collation on MySQL, a sharded rowstore on SingleStore). ``key`` is the primary key."""
    from alembic import op

    context = op.get_context()
    dialect = dialects.for_sqlalchemy(context.dialect)
    return dialect.table_options(None if context.as_sql else op.get_bind(), key)

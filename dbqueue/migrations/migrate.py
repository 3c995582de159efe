"""Schema migrations: Alembic, shipped inside the package, one version table per queue.

The same revisions run from ``alembic upgrade head`` in a checkout (``alembic/env.py``) and from
``dbqueue migrate`` / ``App.migrate()`` in an installed wheel (``dbqueue/migrations/env.py``).
Each queue (table prefix or explicit names) keeps its own version table, ``<jobs table>_alembic``,
so several queues in one database, and the application's own Alembic history, never collide.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import ResolutionError, RevisionError
from alembic.util import CommandError
from sqlalchemy.engine import Connection, Engine

from dbqueue import dialects
from dbqueue.config import Settings, parse_url
from dbqueue.dialects import alembic_ddl  # noqa: F401  (Alembic's rules for every database)
from dbqueue.errors import ConfigurationError, SchemaMissingError
from dbqueue.schema.tables import TableNames, tables_for

MIGRATIONS_DIR = Path(__file__).parent


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


def known_revisions() -> list[str]:
    """Every revision, oldest first."""
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


@dataclass(frozen=True)
class Migrated:
    """What ``upgrade`` / ``downgrade`` did: the revision before and after (None: none)."""

    before: str | None
    after: str | None


def upgrade(bind: Engine | Connection, names: TableNames, revision: str = "head") -> Migrated:
    """Upgrade to ``revision``; refuses, before any DDL, an unknown revision and queue tables
    that exist without a recorded migration (created by hand, or by another tool)."""
    with _connection(bind) as conn:
        current = _checked_current(conn, names, revision)
        if current is None:
            _refuse_unrecorded_tables(conn, names)
        return _run(command.upgrade, conn, names, revision, current)


def upgrade_sql(url: str, names: TableNames, revision: str = "head") -> str:
    """The SQL ``upgrade`` would run on a database of ``url``'s kind, without connecting
    (Alembic's offline mode): to review the DDL, or to hand it to a DBA."""
    check_revision(revision)
    buffer = io.StringIO()
    cfg = alembic_config(names)
    cfg.output_buffer = buffer
    cfg.attributes["offline_url"] = url
    try:
        command.upgrade(cfg, revision, sql=True)
    except CommandError as exc:
        raise _command_error(exc, "upgrade", names, revision, None) from None
    return buffer.getvalue()


def downgrade(bind: Engine | Connection, names: TableNames, revision: str = "base") -> Migrated:
    """Downgrade to ``revision`` (``base``: drop the tables). With no migration recorded,
    downgrading to ``base`` has nothing to do; to anything else it is refused."""
    with _connection(bind) as conn:
        current = _checked_current(conn, names, revision)
        if current is None:
            if revision != "base":
                raise SchemaMissingError(
                    f"cannot downgrade to {revision}: no migration is recorded for the queue "
                    f"tables {names.jobs!r}{_where(names)} (they do not exist): run "
                    f"`dbqueue migrate {revision}` to create them at that migration"
                )
            return Migrated(None, None)
        return _run(command.downgrade, conn, names, revision, current)


#: Alembic's relative targets (``-1``, ``head-2``, ``+1``): resolved against the database.
_RELATIVE = re.compile(r"(?:.+@)?\w*[+-]\d+\Z")


def check_revision(revision: str) -> None:
    """Refuse a revision dbqueue's migrations do not have, listing those they do."""
    if revision in ("head", "heads", "base") or _RELATIVE.match(revision):
        return
    try:
        ScriptDirectory(str(MIGRATIONS_DIR)).revision_map.get_revisions(revision)
    except RevisionError:
        raise _unknown_revision(revision) from None


def _unknown_revision(revision: str) -> ConfigurationError:
    return ConfigurationError(
        f"unknown migration revision {revision!r}: dbqueue's are {', '.join(known_revisions())} "
        "(`head`: the latest; `base`, with --downgrade: no tables)"
    )


@contextlib.contextmanager
def _connection(bind: Engine | Connection) -> Iterator[Connection]:
    if isinstance(bind, Connection):
        yield bind
        return
    with bind.begin() as conn:
        yield conn


def _checked_current(conn: Connection, names: TableNames, revision: str) -> str | None:
    check_revision(revision)
    return current_revision(conn, names)


def _refuse_unrecorded_tables(conn: Connection, names: TableNames) -> None:
    """Queue tables with no recorded migration would make the first CREATE TABLE fail."""
    inspector = sa.inspect(conn)
    found = [
        table.name
        for table in tables_for(names).metadata.sorted_tables
        if inspector.has_table(table.name, schema=names.schema)
    ]
    if found:
        raise ConfigurationError(
            f"table(s) {', '.join(found)}{_where(names)} already exist, but no dbqueue "
            f"migration is recorded for them (in {names.version_table}): they were created "
            "outside `dbqueue migrate`. Drop or rename them, or give dbqueue other tables "
            "(--table-prefix / --schema)"
        )


def _run(step: Any, conn: Connection, names: TableNames, revision: str, current: Any) -> Migrated:
    try:
        with _quiet_alembic():
            step(alembic_config(names, conn), revision)
    except CommandError as exc:
        verb = "downgrade" if step is command.downgrade else "upgrade"
        raise _command_error(exc, verb, names, revision, current) from None
    return Migrated(current, current_revision(conn, names))


@contextlib.contextmanager
def _quiet_alembic() -> Iterator[None]:
    """Alembic logs its set-up and each step at INFO: callers say what changed in one line
    (``Migrated``); with debug logging on, Alembic's lines stay."""
    alembic_log = logging.getLogger("alembic.runtime.migration")
    level = alembic_log.level
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        alembic_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        alembic_log.setLevel(level)


def _command_error(
    exc: CommandError, verb: str, names: TableNames, revision: str, current: str | None
) -> ConfigurationError:
    """Alembic's refusal as one line: what was asked, where the tables are, what exists."""
    if isinstance(exc.__cause__, ResolutionError):
        return _unknown_revision(revision)
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    at = f"at {current}" if current else "at no migration"
    return ConfigurationError(
        f"cannot {verb} the queue tables for {names.jobs!r}{_where(names)} ({at}) to "
        f"{revision!r}: {reason}; the revisions are {', '.join(known_revisions())}"
    )


def _where(names: TableNames) -> str:
    return f" (schema {names.schema!r})" if names.schema else ""


def current_revision(conn: Connection, names: TableNames) -> str | None:
    with _quiet_alembic():
        context = MigrationContext.configure(
            conn,
            opts={"version_table": names.version_table, "version_table_schema": names.schema},
        )
        return context.get_current_revision()


def check_schema(conn: Connection, names: TableNames) -> None:
    """Refuse to run against missing or outdated tables, saying how to fix it."""
    where = _where(names)
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
    url = dialects.resolve_url(url, xargs.get("dialect") or os.environ.get("DBQUEUE_DIALECT"))
    if context.is_offline_mode():
        _migrate_offline(context, url, names)
        return
    engine = dialects.create_engine(url)
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
    given = dialects.sync_url(parse_url(url))
    parsed = dialects.class_for_url(given).normalize_url(given)
    dialect = dialects.for_sqlalchemy(parsed.get_dialect()())
    context.configure(
        dialect_name=parsed.get_backend_name(),
        url=parsed,
        literal_binds=True,
        **_version_options(names, dialect),
    )
    with context.begin_transaction():
        context.run_migrations(names=names)


def script_names(names: TableNames | None) -> TableNames:
    """For migration scripts: the table names ``run_migrations`` hands them. None means a script
    runs inside another project's history (dbqueue's versions in its version_locations), which
    would record dbqueue's revision in that project's version table: refuse, saying what to do."""
    if names is None:
        raise ConfigurationError(
            "dbqueue's migrations cannot run as part of your own Alembic history: remove dbqueue's "
            "migrations/versions from version_locations, and call dbqueue.alembic.upgrade(op, "
            "<App, TableNames or table prefix>, <revision>) from a revision of your own instead "
            "(README: Alembic in your own project)"
        )
    return names


def table_options(key: str) -> dict[str, Any]:
    """For migration scripts: CREATE TABLE options of the database being migrated (engine and
    collation on MySQL, a sharded rowstore on SingleStore). ``key`` is the primary key."""
    from alembic import op

    context = op.get_context()
    dialect = dialects.for_sqlalchemy(context.dialect)
    return dialect.table_options(None if context.as_sql else op.get_bind(), key)

"""dbqueue inside an application's own Alembic project (README: "Alembic in your own project").

Two things an application's Alembic needs from dbqueue:

- ``include_object``, for ``context.configure`` in its env.py, so that ``alembic revision
  --autogenerate`` never proposes to drop (or create) dbqueue's tables;
- ``upgrade`` / ``downgrade``, called from one of the application's revisions, so that its
  ``alembic upgrade head`` also brings the queue tables to a dbqueue revision. dbqueue's revisions
  are recorded in the queue's own version table (``<jobs table>_alembic``), as ``dbqueue
  migrate`` records them, never in the application's: the worker's schema check, ``dbqueue
  migrate`` and the application's history keep agreeing.

The module is named after the library it serves, as users type it next to ``from alembic import
context``. Inside it ``import alembic`` is still the library: imports are absolute in Python 3,
and no dbqueue module is run as a script from dbqueue/ (which would put this file first on
sys.path as ``alembic``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa
from alembic import context as alembic_context
from alembic import op as alembic_op
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

from dbqueue.errors import ConfigurationError
from dbqueue.migrations import migrate
from dbqueue.schema.tables import TABLE_INFO_KEY, TableNames

IncludeObject = Callable[[Any, "str | None", str, bool, Any], bool]

# Columns every dbqueue revision since 0001 has, by which a reflected table is recognised whatever
# its name. A migration that drops or renames one of these must change this list.
_JOBS_COLUMNS = frozenset(
    ("id", "queue", "task", "payload", "payload_hash", "priority", "status", "run_at")
    + ("attempt", "max_attempts", "dead", "live_id")
)
_SUBSCRIPTIONS_COLUMNS = frozenset(
    ("id", "topic", "tenant", "business_group", "url", "http_method", "headers", "active")
)
# These two are generic in shape, so their name's ending (from TableNames) must match too.
_MAINTENANCE_COLUMNS = frozenset(("routine", "last_tick", "runs", "result"))
_VERSION_COLUMNS = frozenset(("version_num",))
# The side tables, by their name's ending and the columns they have had since they were added.
_SIDE_TABLE_COLUMNS = {
    "_maintenance": _MAINTENANCE_COLUMNS,
    "_periodic": frozenset(("name", "tick", "job_id")),  # since 0004
    "_slots": frozenset(("queue", "slot", "job_id", "taken_at")),  # since 0004
    "_cancels": frozenset(("id", "job_id", "requested_at")),  # since 0004
    "_keys": frozenset(("queue", "key", "last_seq")),  # since 0005_keys
    "_unique": frozenset(("queue", "unique_key", "job_id", "rerun_id")),  # since 0006_unique
    "_workers": frozenset(("id", "host", "pid", "heartbeat_at", "expires_at")),  # since 0007
}


# ---- autogenerate ----------------------------------------------------------------------------
def is_dbqueue_table(table: sa.Table) -> bool:
    """Whether ``table`` is one of dbqueue's: by the marker of dbqueue's own Table objects, or,
    for a table reflected from the database, by its columns (any prefix, any explicit names)."""
    if TABLE_INFO_KEY in table.info:
        return True
    columns = frozenset(table.columns.keys())
    if columns >= _JOBS_COLUMNS or columns >= _SUBSCRIPTIONS_COLUMNS:
        return True
    for ending, required in _SIDE_TABLE_COLUMNS.items():
        if table.name.endswith(ending) and columns >= required:
            return True
    return table.name.endswith("_alembic") and columns == _VERSION_COLUMNS


def include_object(
    object_: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Alembic's ``include_object`` hook: False for dbqueue's tables and what belongs to them.

    A table of the application's own MetaData is judged by the marker alone, so a table of the
    application's that merely looks like dbqueue's is never skipped; a table only in the database
    is also judged by its columns, so a queue of any prefix is never proposed for DROP.
    """
    if type_ == "table":
        if reflected and compare_to is None:
            return not is_dbqueue_table(object_)
        return TABLE_INFO_KEY not in object_.info
    table = getattr(object_, "table", None)
    return not (isinstance(table, sa.Table) and TABLE_INFO_KEY in table.info)


def include_object_with(*hooks: IncludeObject) -> IncludeObject:
    """``include_object`` combined with the application's own hooks: an object is included when
    it is not dbqueue's and every hook includes it."""

    def combined(object_: Any, name: str | None, type_: str, reflected: bool, compare_to: Any):
        if not include_object(object_, name, type_, reflected, compare_to):
            return False
        return all(hook(object_, name, type_, reflected, compare_to) for hook in hooks)

    return combined


# ---- dbqueue's revisions from the application's ----------------------------------------------
def upgrade(target: Any, queue: Any = None, revision: str = "head") -> None:
    """Bring ``queue``'s tables up to dbqueue's ``revision`` on ``target``'s connection.

    ``target``: alembic's ``op`` in a revision of the application's (the upgrade then shares its
    transaction), a MigrationContext, a Connection or an Engine. ``queue``: an App, a TableNames,
    a table prefix, or None for the default ``dbqueue_`` tables. A queue already at or past
    ``revision`` is left as it is.
    """
    names = queue_names(queue)
    with _connection(target, names) as conn, _keeping_alembic_proxies():
        migrate.upgrade(conn, names, revision)


def downgrade(target: Any, queue: Any = None, revision: str = "base") -> None:
    """Take ``queue``'s tables down to dbqueue's ``revision`` (``base``: drop them, jobs and all).
    A queue already at or below ``revision``, or without tables, is left as it is."""
    names = queue_names(queue)
    with _connection(target, names) as conn, _keeping_alembic_proxies():
        if _is_past(conn, names, revision):
            migrate.downgrade(conn, names, revision)


def queue_names(queue: Any = None) -> TableNames:
    """The table names of an App (or anything with ``.names``), a TableNames, or a prefix."""
    if queue is None or isinstance(queue, str):
        return TableNames.resolve(queue)
    names = getattr(queue, "names", queue)
    if not isinstance(names, TableNames):
        raise ConfigurationError(
            f"dbqueue.alembic: expected an App, a TableNames or a table prefix, got {queue!r}"
        )
    return names


def _is_past(conn: Connection, names: TableNames, revision: str) -> bool:
    current = migrate.current_revision(conn, names)
    if current is None or revision == "base":
        return current is not None
    script = ScriptDirectory(str(migrate.MIGRATIONS_DIR))
    wanted = script.get_revision(revision).revision
    below = {s.revision for s in script.iterate_revisions(current, "base")} - {current}
    return wanted in below


@contextlib.contextmanager
def _connection(target: Any, names: TableNames) -> Iterator[Connection]:
    if isinstance(target, Engine):
        with target.begin() as conn:
            yield conn
        return
    if isinstance(target, Connection):
        yield target
        return
    context = target.get_context() if hasattr(target, "get_context") else target
    if not isinstance(context, MigrationContext):
        raise ConfigurationError(
            "dbqueue.alembic: expected alembic's op, a MigrationContext, a Connection or an "
            f"Engine, got {target!r}"
        )
    if context.as_sql:
        raise ConfigurationError(
            f"dbqueue.alembic cannot write the DDL of {names.jobs!r} into an offline (--sql) "
            "script: print it with `dbqueue migrate --sql --url URL` (same table prefix) and "
            "run it next to this script"
        )
    yield context.connection


@contextlib.contextmanager
def _keeping_alembic_proxies() -> Iterator[None]:
    """A run of dbqueue's migrations inside the application's replaces, and on leaving deletes,
    the module-level ``alembic.context`` and ``alembic.op`` of the run around it (Alembic keeps
    one of each); the application's revision and env.py go on using them, so put them back."""
    saved = [getattr(module, "_proxy", None) for module in (alembic_context, alembic_op)]
    try:
        yield
    finally:
        for proxy in saved:
            if proxy is not None:
                proxy._install_proxy()

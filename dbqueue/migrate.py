"""``dbqueue.migrate``: the queue's schema migrations.

A documented import path, kept: the code lives in ``dbqueue.migrations.migrate``."""

from dbqueue.migrations.migrate import (
    MIGRATIONS_DIR,
    Migrated,
    alembic_config,
    check_revision,
    check_schema,
    current_revision,
    downgrade,
    head_revision,
    known_revisions,
    run_migrations,
    script_names,
    table_options,
    upgrade,
    upgrade_sql,
)

__all__ = [
    "MIGRATIONS_DIR",
    "alembic_config",
    "head_revision",
    "known_revisions",
    "Migrated",
    "upgrade",
    "upgrade_sql",
    "downgrade",
    "check_revision",
    "current_revision",
    "check_schema",
    "run_migrations",
    "script_names",
    "table_options",
]

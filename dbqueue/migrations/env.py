"""Alembic environment for dbqueue's own migrations (see migrate.py beside it)."""

from alembic import context

from dbqueue.migrations.migrate import run_migrations

run_migrations(context)

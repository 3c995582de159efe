"""Alembic environment for dbqueue's own migrations (see dbqueue/migrate.py)."""

from alembic import context

from dbqueue.migrate import run_migrations

run_migrations(context)

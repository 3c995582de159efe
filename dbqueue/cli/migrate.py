"""``dbqueue migrate``: create, upgrade, downgrade or show the queue tables' schema."""

from __future__ import annotations

from typing import Any

import click
import sqlalchemy as sa

from dbqueue.app.facade import App
from dbqueue.cli.options import creates_database, database_options
from dbqueue.config import redact
from dbqueue.errors import DatabaseUnavailableError


@click.command()
@database_options
@click.argument("revision", default="head")
@click.option("--downgrade", is_flag=True, help="Downgrade to REVISION (default: base).")
@click.option("--show", is_flag=True, help="Print the current and latest revision, change nothing.")
@click.option("--sql", is_flag=True, help="Print the upgrade's SQL without connecting.")
@creates_database(lambda options: not (options["show"] or options["downgrade"]))
def migrate(app: App, revision: str, downgrade: bool, show: bool, sql: bool) -> None:
    """Create or upgrade the queue tables (the same migrations as `alembic upgrade head`)."""
    from dbqueue.migrations import migrate as migrations

    if sql:
        click.echo(migrations.upgrade_sql(app.url, app.names, revision), nl=False)
        return
    where = f"{app.names.jobs} on {redact(app.url)}"
    try:
        if show:
            with app.engine.connect() as conn:
                current = migrations.current_revision(conn, app.names)
            click.echo(f"current: {current or 'none'}  latest: {migrations.head_revision()}")
            return
        if downgrade:
            done = migrations.downgrade(
                app.engine, app.names, "base" if revision == "head" else revision
            )
        else:
            done = migrations.upgrade(app.engine, app.names, revision)
    except sa.exc.OperationalError as exc:
        raise DatabaseUnavailableError(
            f"cannot migrate {redact(app.url)}: {str(exc.orig).strip().splitlines()[0]} "
            "(check --url / DBQUEUE_URL, that the server is running, and the credentials)"
        ) from None
    click.echo(_migrated(done, downgrade, revision, where))


def _migrated(done: Any, downgrade: bool, revision: str, where: str) -> str:
    """One line: what the migration changed, or why it changed nothing."""
    if done.before != done.after:
        verb = "downgraded" if downgrade else "migrated"
        return f"{verb} {where} from {done.before or 'none'} to {done.after or 'none (no tables)'}"
    if done.after is None:
        return f"nothing to downgrade: no dbqueue migration is recorded for {where}"
    back = "" if downgrade or revision == "head" else f" (to go back: --downgrade {revision})"
    return f"nothing to {'downgrade' if downgrade else 'upgrade'}: {where} is at {done.after}{back}"

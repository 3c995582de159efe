"""``dbqueue maintenance``: run a leader-elected routine by hand, and see when each last ran."""

from __future__ import annotations

import json

import click

from dbqueue.app.facade import App
from dbqueue.cli.options import database_options
from dbqueue.cli.output import json_default


@click.group()
def maintenance() -> None:
    """The leader-elected routines: purge, rescue, renotify."""


@maintenance.command("run")
@database_options
@click.argument("routine", type=click.Choice(["purge", "rescue", "renotify"]))
@click.option("--strategy", help="Whose locks tell live workers (env DBQUEUE_STRATEGY).")
@click.option("--server", envvar="DBQUEUE_LOCK_SERVER", help="HOST:PORT of `dbqueue server`.")
@click.option("--purge-max-age", type=float, help="Days to keep finished jobs.")
@click.option("--purge-limit", type=int, help="Rows per purge chunk.")
def maintenance_run(
    app: App,
    routine: str,
    strategy: str | None,
    server: str | None,
    purge_max_age: float | None,
    purge_limit: int | None,
) -> None:
    """Run one routine now, as the workers' leader would, and print what it did."""
    app = app.reconfigured(
        purge_max_age_days=purge_max_age,
        purge_limit=purge_limit,
        lock_server=server,
        notify_server=server,
    )
    click.echo(app.run_maintenance(routine, strategy=strategy))


@maintenance.command("status")
@database_options
@click.option("--json", "as_json", is_flag=True)
def maintenance_status(app: App, as_json: bool) -> None:
    """When each routine last ran, where, how often, and its result."""
    rows = app.maintenance_status()
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=json_default))
        return
    for row in rows:
        tick = row["last_tick"].isoformat(timespec="seconds") if row["last_tick"] else "never"
        click.echo(
            f"{row['routine']:9} runs {row['runs']:>5}  last tick {tick}  "
            f"{row['worker_id'] or '-'}  {row['result'] or ''}"
        )

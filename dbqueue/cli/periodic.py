"""``dbqueue periodic list``: the --app's schedules and the ticks they enqueued."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import click

from dbqueue.app.facade import App
from dbqueue.cli.options import database_options, given_app_spec
from dbqueue.cli.output import json_default, json_option


@click.group()
def periodic() -> None:
    """Periodic schedules (declared in your --app) and the ticks they enqueued."""


@periodic.command("list")
@database_options
@json_option
def periodic_list(app: App, as_json: bool) -> None:
    """Each schedule: cron and tz, task and queue, last and next tick, the last job's status."""
    rows = app.periodic_status()
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=json_default))
        return
    if not rows:
        hint = "" if given_app_spec() else " (pass --app)"
        click.echo(f"no periodic schedules{hint}")
        return
    unknown = "not in the --app" if given_app_spec() else "no --app"
    for row in rows:
        click.echo(_describe_schedule(row, unknown))


def _describe_schedule(row: dict[str, Any], unknown: str) -> str:
    def when(value: dt.datetime | None) -> str:
        return value.isoformat() if value else "-"

    if row["declared"]:
        rule = f"{row['cron']} ({row['tz']}, catch_up {row['catch_up']})"
        target = f"task {row['task']} on queue {row['queue']}"
    else:
        rule, target = f"({unknown})", "-"
    job = "no job yet"
    if row["last_job_id"] is not None:
        job = f"job {row['last_job_id']} {row['last_job_status'] or 'purged'}"
    return (
        f"{row['name']:24} {rule:44} {target:36} last {when(row['last_tick'])}  "
        f"next {when(row['next_tick'])}  {job}"
    )

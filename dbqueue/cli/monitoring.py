"""``dbqueue stats`` and ``dbqueue workers``: the queues' counts and the live workers."""

from __future__ import annotations

import json

import click

from dbqueue.app.facade import App
from dbqueue.app.monitoring import STATUS_KEYS, stats_report
from dbqueue.cli.options import database_options
from dbqueue.cli.output import json_option


@click.command()
@database_options
@json_option
def stats(app: App, as_json: bool) -> None:
    """Jobs per queue and status, and how long the oldest runnable job has waited (--json:
    the dashboard's /api/v1/stats, in Lowkiq's shape)."""
    rows = app.stats()
    if as_json:
        click.echo(json.dumps(stats_report(rows), indent=2))
        return
    if not rows:
        click.echo("no jobs")
        return
    click.echo(f"{'queue':20} " + " ".join(f"{s:>10}" for s in STATUS_KEYS) + "  oldest runnable")
    for row in rows:
        counts = row.by_status
        age = "-" if row.oldest_runnable_age is None else f"{row.oldest_runnable_age:.1f}s"
        click.echo(
            f"{row.queue:20} " + " ".join(f"{counts[s]:>10}" for s in STATUS_KEYS) + f"  {age}"
        )


@click.command()
@database_options
@json_option
@click.option("--all", "include_gone", is_flag=True, help="Also workers whose heartbeat expired.")
def workers(app: App, as_json: bool, include_gone: bool) -> None:
    """The worker processes in the registry of live workers, and what they run now."""
    rows = app.workers(include_gone=include_gone)
    if as_json:
        click.echo(json.dumps([row.as_dict() for row in rows], indent=2))
        return
    if not rows:
        click.echo("no live workers")
        return
    click.echo(
        f"{'worker':28} {'strategy':13} {'conc':>4} {'running':>7} {'processed':>9} "
        f"{'failed':>7}  {'heartbeat':19}  queues / jobs"
    )
    for row in rows:
        beat = row.heartbeat_at.strftime("%Y-%m-%d %H:%M:%S")
        state = "" if row.alive else "  (gone)"
        jobs = ", ".join(f"{job['id']} {job['task']}" for job in row.jobs[:10])
        click.echo(
            f"{row.name:28} {row.strategy:13} {row.concurrency:>4} {row.running:>7} "
            f"{row.processed:>9} {row.failed:>7}  {beat}  {','.join(row.queues)}"
            + (f" / {jobs}" if jobs else "")
            + state
        )

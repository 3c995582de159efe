"""``dbqueue dead``: the morgue, the jobs whose attempts are exhausted: list, requeue, delete."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from dbqueue.app.facade import App
from dbqueue.app.morgue import MORGUE_ORDERS
from dbqueue.cli.options import database_options
from dbqueue.cli.output import json_default
from dbqueue.errors import ConfigurationError


@click.group()
def dead() -> None:
    """The morgue: jobs whose attempts are exhausted."""


@dead.command("list")
@database_options
@click.option("--queue", help="Only this queue's dead jobs.")
@click.option("--task", help="Only this task's dead jobs.")
@click.option("--limit", default=100, show_default=True)
@click.option(
    "--order",
    type=click.Choice(MORGUE_ORDERS),
    default="finished_at",
    show_default=True,
    help="finished_at: the newest death first; id: the oldest job first.",
)
@click.option("--json", "as_json", is_flag=True)
def dead_list(
    app: App, queue: str | None, task: str | None, limit: int, order: str, as_json: bool
) -> None:
    """List dead jobs, newest death first (or by --order id)."""
    rows = app.dead_jobs(queue, limit, task=task, order_by=order)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=json_default))
        return
    if not rows:
        click.echo("no dead jobs")
        return
    for row in rows:
        message = (row["message"] or "").splitlines()[0][:100] if row["message"] else ""
        click.echo(
            f"{row['id']:>8}  {row['queue']:12} {row['task']:24} attempts {row['attempt']}/"
            f"{row['max_attempts']}  {message}"
        )


def morgue_action(verb: str) -> Callable[[Callable[..., Any]], Any]:
    """``dead requeue`` and ``dead delete``: job ids, or --all with an optional filter."""

    def register(command: Callable[..., Any]) -> Any:
        options = [
            dead.command(verb, help=command.__doc__),
            database_options,
            click.argument("ids", nargs=-1, type=int),
            click.option(
                "--all",
                "every",
                is_flag=True,
                help=f"{verb.title()} every dead job (of --task / --queue when given).",
            ),
            click.option("--task", help="With --all: only this task's dead jobs."),
            click.option("--queue", help="With --all: only this queue's dead jobs."),
        ]
        for option in reversed(options):
            command = option(command)
        return command

    return register


def _morgue_targets(
    verb: str, ids: tuple[int, ...], every: bool, task: str | None, queue: str | None
) -> list[int] | None:
    """The ids to act on, or None for "every dead job the filter matches"."""
    if ids and every:
        raise ConfigurationError(f"dead {verb}: give job ids or --all, not both")
    if (task or queue) and not every:
        raise ConfigurationError(f"dead {verb}: --task and --queue filter --all; add --all")
    if not ids and not every:
        raise ConfigurationError(
            f"dead {verb}: give the job ids (see `dbqueue dead list`), or --all "
            "[--task T] [--queue Q] for every dead job"
        )
    return None if every else list(ids)


def _report_morgue(verb: str, ids: list[int] | None, done: list[int]) -> None:
    click.echo(f"{verb} {len(done)}: {' '.join(map(str, done)) or '-'}")
    missing = sorted(set(ids or ()) - set(done))
    if missing:
        raise click.ClickException(
            f"not dead (or no such job): {' '.join(map(str, missing))}; `dbqueue dead list` "
            "shows the dead jobs"
        )


@morgue_action("requeue")
def dead_requeue(
    app: App, ids: tuple[int, ...], every: bool, task: str | None, queue: str | None
) -> None:
    """Run dead jobs again (attempts start over): IDS..., or --all [--task T] [--queue Q]."""
    chosen = _morgue_targets("requeue", ids, every, task, queue)
    _report_morgue("requeued", chosen, app.requeue_dead(chosen, task=task, queue=queue))


@morgue_action("delete")
def dead_delete(
    app: App, ids: tuple[int, ...], every: bool, task: str | None, queue: str | None
) -> None:
    """Delete dead jobs for good: IDS..., or --all [--task T] [--queue Q]."""
    chosen = _morgue_targets("delete", ids, every, task, queue)
    _report_morgue("deleted", chosen, app.delete_dead(chosen, task=task, queue=queue))

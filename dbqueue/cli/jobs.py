"""One job at a time: ``dbqueue enqueue`` one, ``dbqueue result`` of one, ``dbqueue job show``
every column of one."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import click

from dbqueue.app.facade import App
from dbqueue.cli.options import database_options, given_app_spec
from dbqueue.cli.output import json_default
from dbqueue.errors import (
    ConfigurationError,
    JobCancelledError,
    JobFailedError,
    JobNotFinishedError,
)


@click.command()
@database_options
@click.argument("task")
@click.option("--payload", default="null", help="JSON payload.")
@click.option("--queue", help="Queue (default: the task's, else 'default').")
@click.option("--priority", type=int, help="Lower runs first (default 50).")
@click.option("--delay", type=float, help="Seconds before it may run.")
@click.option("--max-attempts", type=int)
@click.option("--external-key")
@click.option("--origin")
@click.option("--destination")
@click.option("--tenant", type=int)
@click.option("--business-group")
@click.option("--unique-key", help="Unique among the queue's unfinished jobs (see README).")
@click.option(
    "--on-conflict",
    type=click.Choice(["skip", "replace", "rerun"]),
    help="When an unfinished job holds --unique-key (default skip); prints that job's id.",
)
@click.option("--key", help="Jobs of the queue sharing a key never run at once (see key_mode).")
def enqueue(app: App, task: str, payload: str, **options: Any) -> None:
    """Enqueue one job and print its id."""
    try:
        value = json.loads(payload)
    except ValueError as exc:
        raise ConfigurationError(
            f"--payload is not valid JSON ({exc}): e.g. '{{\"order\": 42}}'"
        ) from None
    spec = given_app_spec()
    if spec and not app.registry.handles(task):
        known = ", ".join(name for name in app.registry.names() if app.registry.handles(name))
        raise ConfigurationError(
            f"unknown task {task!r}: --app {spec} registers {known or 'no task'}; enqueue one "
            "of those (without --app, any task name is accepted)"
        )
    click.echo(app.enqueue(None, task, value, **options))


class _JobError(click.ClickException):
    """One line, and an exit status that says why there is no result."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it a ClassVar


#: ``dbqueue result`` exit statuses (1: any other error, such as no such job).
RESULT_EXIT = {JobCancelledError: 4, JobFailedError: 3, JobNotFinishedError: 5}


@click.command()
@database_options
@click.argument("job_id", type=int)
@click.option("--wait", type=float, help="Seconds to wait for the job to finish (default: none).")
def result(app: App, job_id: int, wait: float | None) -> None:
    """Print a finished job's result as JSON (exit 3: dead, 4: cancelled, 5: not finished)."""
    try:
        value = app.result(job_id, timeout=wait)
    except (JobFailedError, JobNotFinishedError) as exc:
        code = next(c for kind, c in RESULT_EXIT.items() if isinstance(exc, kind))
        raise _JobError(str(exc).splitlines()[0], code) from None
    click.echo(json.dumps(value, ensure_ascii=False, sort_keys=True))


@click.group()
def job() -> None:
    """One job, every column."""


@job.command("show")
@database_options
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def job_show(app: App, job_id: int, as_json: bool) -> None:
    """Every column of a job; its payload and result as indented JSON, its errors one
    paragraph per failed attempt."""
    row = app.get_job(job_id)
    if row is None:
        raise click.ClickException(
            f"there is no job {job_id} in {app.names.qualified_jobs}: it was never enqueued "
            "there, or purged after its retention period"
        )
    if as_json:
        click.echo(json.dumps(row, indent=2, ensure_ascii=False, default=json_default))
        return
    width = max(map(len, row))
    for name, value in row.items():
        if name in ("payload", "result"):
            text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
        elif name == "errors" and isinstance(value, list) and value:  # one per failed attempt
            click.echo(f"{name}:")
            click.echo(textwrap.indent("\n".join(map(_attempt_error, value)), "    "))
            continue
        else:
            text = "" if value is None else str(value)
        if "\n" in text:
            click.echo(f"{name}:")
            click.echo(textwrap.indent(text, "    "))
        else:
            click.echo(f"{name:<{width}}  {text}")


def _attempt_error(entry: Any) -> str:
    """One entry of a job's errors: its attempt, time and message, its traceback indented."""
    if not isinstance(entry, dict):  # written by hand
        return json.dumps(entry, ensure_ascii=False)
    head = f"attempt {entry.get('attempt')} at {entry.get('at')}: {entry.get('message')}"
    trace = entry.get("traceback")
    return f"{head}\n{textwrap.indent(trace, '    ')}" if trace else head

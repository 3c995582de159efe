"""``dbqueue cancel`` and ``dbqueue cancel-publication``: one line per job, exit 1 naming the ids
that are no job."""

from __future__ import annotations

import json

import click

from dbqueue.app.facade import App
from dbqueue.cli.options import database_options
from dbqueue.cli.output import json_option
from dbqueue.errors import ConfigurationError
from dbqueue.job import PUBLICATION_MARKER
from dbqueue.runtime.cancellation import NOT_FOUND


def _print_cancelled(report: dict[int, str], as_json: bool) -> None:
    """One line per job (or a JSON object); exit 1 naming the ids that are no job."""
    if as_json:
        click.echo(json.dumps({str(job_id): said for job_id, said in report.items()}, indent=2))
    else:
        for job_id, said in report.items():
            click.echo(f"job {job_id}: {said}")
    missing = [str(job_id) for job_id, said in report.items() if said == NOT_FOUND]
    if missing:
        raise click.ClickException(
            f"no such job: {' '.join(missing)} (finished jobs are purged after the retention "
            "period)"
        )


@click.command()
@database_options
@click.argument("ids", nargs=-1, type=int, required=True)
@json_option
def cancel(app: App, ids: tuple[int, ...], as_json: bool) -> None:
    """Cancel jobs: waiting ones at once, running ones by request (their worker stops them
    within about a second); finished ones are left as they are. One line per job."""
    _print_cancelled(app.cancel(ids), as_json)


@click.command("cancel-publication")
@database_options
@click.argument("publication_id", type=int)
@json_option
def cancel_publication(app: App, publication_id: int, as_json: bool) -> None:
    """Cancel every delivery of a publication (its id, as `publish` returned it)."""
    report = app.cancel_publication(publication_id)
    if not report:
        record = app.get_job(publication_id)
        if record is None or record["subscription_id"] != PUBLICATION_MARKER:
            raise ConfigurationError(
                f"no publication {publication_id}: give the id `publish` returned (the "
                "publication's own row, whose subscription_id is '*')"
            )
        click.echo(f"publication {publication_id} has no deliveries")
    _print_cancelled(report, as_json)

"""The ``dbqueue`` click group: every command, each from the module of its group."""

from __future__ import annotations

import click

from dbqueue.cli import (
    cancel,
    dashboard,
    dead,
    jobs,
    maintenance,
    migrate,
    monitoring,
    periodic,
    server,
    subscriptions,
    worker,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dbqueue")
def cli() -> None:
    """dbqueue: durable job queues in your own database."""


#: The top-level commands and groups (``dbqueue --help`` lists them by name).
COMMANDS: tuple[click.Command, ...] = (
    worker.worker,
    maintenance.maintenance,
    migrate.migrate,
    jobs.enqueue,
    jobs.result,
    jobs.job,
    cancel.cancel,
    cancel.cancel_publication,
    monitoring.stats,
    monitoring.workers,
    periodic.periodic,
    dead.dead,
    subscriptions.subscriptions,
    server.server,
    dashboard.dashboard,
)
for command in COMMANDS:
    cli.add_command(command)


def main() -> None:
    cli(prog_name="dbqueue")


__all__ = ["cli", "main"]

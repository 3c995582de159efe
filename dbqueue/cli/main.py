"""The ``dbqueue`` click group: every command, each from the module of its group.

A command's module is imported when that command runs (or its own help is asked for): every one
of them builds an App, which loads SQLAlchemy's engine, the job engine and the worker; listing
the commands (``dbqueue --help``) needs none of that, only each command's summary below.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

import click

from dbqueue.base.distribution import DISTRIBUTION


class LazyCommand(NamedTuple):
    """Where a command is defined, and the summary ``dbqueue --help`` lists it with: the first
    paragraph of its help, which tests hold to the command's own."""

    module: str
    attribute: str
    summary: str

    def load(self) -> click.Command:
        return getattr(importlib.import_module(self.module), self.attribute)

    def short_help(self, name: str, limit: int) -> str:
        """The line click would list the loaded command with (a stand-in cut the same way)."""
        return click.Command(name, help=self.summary).get_short_help_str(limit)


#: The top-level commands and groups, by name.
COMMANDS: dict[str, LazyCommand] = {
    "worker": LazyCommand(
        "dbqueue.cli.worker",
        "worker",
        "Run a worker until SIGTERM/SIGINT (or --burst / a limit); a second signal stops it at "
        "once.",
    ),
    "maintenance": LazyCommand(
        "dbqueue.cli.maintenance",
        "maintenance",
        "The leader-elected routines: purge, rescue, renotify.",
    ),
    "migrate": LazyCommand(
        "dbqueue.cli.migrate",
        "migrate",
        "Create or upgrade the queue tables (the same migrations as `alembic upgrade head`).",
    ),
    "enqueue": LazyCommand("dbqueue.cli.jobs", "enqueue", "Enqueue one job and print its id."),
    "result": LazyCommand(
        "dbqueue.cli.jobs",
        "result",
        "Print a finished job's result as JSON (exit 3: dead, 4: cancelled, 5: not finished).",
    ),
    "job": LazyCommand("dbqueue.cli.jobs", "job", "One job, every column."),
    "cancel": LazyCommand(
        "dbqueue.cli.cancel",
        "cancel",
        "Cancel jobs: waiting ones at once, running ones by request (their worker stops them "
        "within about a second); finished ones are left as they are. One line per job.",
    ),
    "cancel-publication": LazyCommand(
        "dbqueue.cli.cancel",
        "cancel_publication",
        "Cancel every delivery of a publication (its id, as `publish` returned it).",
    ),
    "stats": LazyCommand(
        "dbqueue.cli.monitoring",
        "stats",
        "Jobs per queue and status, and how long the oldest runnable job has waited (--json: "
        "the dashboard's /api/v1/stats, in Lowkiq's shape).",
    ),
    "workers": LazyCommand(
        "dbqueue.cli.monitoring",
        "workers",
        "The worker processes in the registry of live workers, and what they run now.",
    ),
    "periodic": LazyCommand(
        "dbqueue.cli.periodic",
        "periodic",
        "Periodic schedules (declared in your --app) and the ticks they enqueued.",
    ),
    "dead": LazyCommand(
        "dbqueue.cli.dead", "dead", "The morgue: jobs whose attempts are exhausted."
    ),
    "subscriptions": LazyCommand(
        "dbqueue.cli.subscriptions",
        "subscriptions",
        "Pub/sub subscriptions: who receives each topic (code, or a webhook).",
    ),
    "server": LazyCommand(
        "dbqueue.cli.server",
        "server",
        "Run the lock server: named locks and wake-ups over TCP (token: "
        "DBQUEUE_LOCK_SERVER_TOKEN).",
    ),
    "dashboard": LazyCommand(
        "dbqueue.cli.dashboard",
        "dashboard",
        "Serve the web dashboard (token: DBQUEUE_DASHBOARD_TOKEN; needs dbqueue-sql[dashboard]).",
    ),
}


class LazyGroup(click.Group):
    """A group whose ``COMMANDS`` are imported when first looked up (click's documented pattern,
    "Lazily Loading Subcommands"), and listed in its help by their summaries, unimported."""

    def __init__(self, *args: Any, lazy_commands: dict[str, LazyCommand], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        lazy = self.lazy_commands.get(cmd_name)
        if lazy is not None and cmd_name not in self.commands:
            self.add_command(lazy.load(), cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's list of commands, each line from the summary of a command not loaded yet."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            loaded = self.commands.get(name)
            if loaded is None:
                rows.append((name, self.lazy_commands[name].short_help(name, limit)))
            elif not loaded.hidden:
                rows.append((name, loaded.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(
    cls=LazyGroup,
    lazy_commands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name=DISTRIBUTION)
def cli() -> None:
    """dbqueue: durable job queues in your own database."""


def main() -> None:
    cli(prog_name="dbqueue")


__all__ = ["cli", "main"]

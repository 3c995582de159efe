"""``dbqueue`` command line: worker, migrate, enqueue, stats, dead."""

from __future__ import annotations

import datetime as dt
import functools
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import click
import sqlalchemy as sa

from .app import App
from .config import Settings, parse_bool, parse_minutes, redact, resolve_url
from .errors import ConfigurationError, DatabaseUnavailableError, DbqueueError

DIALECT_HELP = (
    "postgresql, mysql, singlestore or sqlite (with the DB_* variables, or to check --url)"
)


def _configure_logging(verbose: bool) -> None:
    debug = verbose
    if not debug and os.environ.get("LOG_DEBUG"):
        debug = parse_bool(os.environ["LOG_DEBUG"], "LOG_DEBUG")
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if debug:
        logging.getLogger("sqlalchemy.engine").setLevel(logging.WARNING)


def load_app(spec: str | None) -> App | None:
    """``module:attribute`` (attribute default ``app``) → the App it names."""
    if not spec:
        return None
    module_name, _, attribute = spec.partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"--app {spec}: cannot import module {module_name!r} ({exc}); give an importable "
            "module, e.g. --app myproject.jobs:app"
        ) from None
    app = getattr(module, attribute or "app", None)
    if not isinstance(app, App):
        raise ConfigurationError(
            f"--app {spec}: {module_name}.{attribute or 'app'} is "
            f"{'missing' if app is None else type(app).__name__}, not a dbqueue.App"
        )
    return app


def database_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--url, --dialect, --table-prefix, --schema, --app and -v, shared by every command."""
    options = [
        click.option("--url", envvar="DBQUEUE_URL", help="Database URL (env DBQUEUE_URL)."),
        click.option("--dialect", envvar="DBQUEUE_DIALECT", help=DIALECT_HELP),
        click.option(
            "--table-prefix", envvar="DBQUEUE_TABLE_PREFIX", help="Queue table prefix (dbqueue_)."
        ),
        click.option("--schema", envvar="DBQUEUE_SCHEMA", help="Database schema of the tables."),
        click.option(
            "--app", "app_spec", envvar="DBQUEUE_APP", help="module:attribute of your dbqueue.App."
        ),
        click.option("-v", "--verbose", is_flag=True, help="Debug logging (env LOG_DEBUG)."),
    ]
    for option in reversed(options):
        command = option(command)

    @functools.wraps(command)
    def wrapper(
        url: str | None,
        dialect: str | None,
        table_prefix: str | None,
        schema: str | None,
        app_spec: str | None,
        verbose: bool,
        **kwargs: Any,
    ) -> Any:
        _configure_logging(verbose)
        with OneLineErrors():
            app = build_app(url, dialect, table_prefix, schema, app_spec)
            return command(app=app, **kwargs)

    return wrapper


def build_app(
    url: str | None,
    dialect: str | None,
    table_prefix: str | None,
    schema: str | None,
    app_spec: str | None,
) -> App:
    resolved = resolve_url(url, dialect)  # validates --dialect and the URL early
    app = load_app(app_spec)
    if app is None:
        return App(resolved, table_prefix=table_prefix, schema=schema)
    if url or dialect or table_prefix or schema:
        settings = app.settings.merged(url=resolved, table_prefix=table_prefix, schema=schema)
        configured = App(settings=settings, backoff=app.backoff)
        configured.registry = app.registry
        return configured
    return app


class OneLineErrors:
    """dbqueue's own errors and unreachable databases print one line, not a traceback."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, DbqueueError):
            raise click.ClickException(str(exc)) from None
        if isinstance(exc, sa.exc.OperationalError):
            first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            raise click.ClickException(
                f"database error: {first} (check --url / DBQUEUE_URL, that the server is "
                "running, and the credentials)"
            ) from None
        return False


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dbqueue")
def cli() -> None:
    """dbqueue: durable job queues in your own database."""


def _minutes(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    try:
        return parse_minutes(value, param.opts[0])
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc)) from None


@cli.command()
@database_options
@click.option("--queue", "queues", multiple=True, help="Queue to consume (repeatable).")
@click.option("--concurrency", default=1, show_default=True, help="Worker threads.")
@click.option("--burst", is_flag=True, help="Exit when nothing is runnable.")
@click.option("--max-jobs", type=int, help="Stop after this many jobs.")
@click.option("--max-runtime", type=float, help="Stop claiming after this many seconds.")
@click.option(
    "--strategy", envvar="DBQUEUE_STRATEGY", help="Claim strategy (default: the database's)."
)
@click.option("--batch-size", default=10, show_default=True, help="Most jobs claimed at once.")
@click.option(
    "--poll-interval", type=float, help="Longest idle sleep, s (1; 30 with push wake-ups)."
)
@click.option("--min-poll-interval", default=0.05, show_default=True, help="First idle sleep, s.")
@click.option("--no-maintenance", is_flag=True, help="Take no part in purge/rescue/re-notify.")
@click.option("--rescue-minutes", callback=_minutes, help="QUEUE_MINUTE_RETRY_THREAD, e.g. */5")
@click.option("--purge-minutes", callback=_minutes, help="QUEUE_MINUTE_PURGE_THREAD, e.g. 0")
@click.option("--notify-minutes", callback=_minutes, help="QUEUE_MINUTE_NOTIFY_THREAD, e.g. */5")
@click.option(
    "--purge-max-age", type=float, help="QUEUE_PURGE_MAX_AGE: days to keep finished jobs."
)
@click.option("--purge-limit", type=int, help="QUEUE_PURGE_LIMIT: rows per purge chunk.")
@click.option(
    "--wait-notify-interval", type=float, help="QUEUE_WAIT_NOTIFY_INTERVAL: fallback poll, s."
)
def worker(
    app: App,
    queues: tuple[str, ...],
    no_maintenance: bool,
    rescue_minutes: Any,
    purge_minutes: Any,
    notify_minutes: Any,
    purge_max_age: float | None,
    purge_limit: int | None,
    wait_notify_interval: float | None,
    **options: Any,
) -> None:
    """Run a worker until SIGTERM/SIGINT (or --burst / a limit)."""
    if not app.registry.names() and app.registry.catch_all is None:
        logging.getLogger("dbqueue").warning(
            "no tasks registered (pass --app module:app): every job claimed will fail as unknown"
        )
    app.settings = app.settings.merged(
        rescue_minutes=rescue_minutes,
        purge_minutes=purge_minutes,
        notify_minutes=notify_minutes,
        purge_max_age_days=purge_max_age,
        purge_limit=purge_limit,
        wait_notify_interval=wait_notify_interval,
    )
    summary = app.run_worker(queues=list(queues) or None, maintenance=not no_maintenance, **options)
    click.echo(f"worker stopped: {summary.succeeded} succeeded, {summary.failed} failed", err=True)


@cli.group()
def maintenance() -> None:
    """The leader-elected routines: purge, rescue, renotify."""


@maintenance.command("run")
@database_options
@click.argument("routine", type=click.Choice(["purge", "rescue", "renotify"]))
@click.option("--strategy", envvar="DBQUEUE_STRATEGY", help="Whose locks tell live workers.")
@click.option("--purge-max-age", type=float, help="Days to keep finished jobs.")
@click.option("--purge-limit", type=int, help="Rows per purge chunk.")
def maintenance_run(
    app: App,
    routine: str,
    strategy: str | None,
    purge_max_age: float | None,
    purge_limit: int | None,
) -> None:
    """Run one routine now, as the workers' leader would, and print what it did."""
    app.settings = app.settings.merged(purge_max_age_days=purge_max_age, purge_limit=purge_limit)
    click.echo(app.run_maintenance(routine, strategy=strategy))


@maintenance.command("status")
@database_options
@click.option("--json", "as_json", is_flag=True)
def maintenance_status(app: App, as_json: bool) -> None:
    """When each routine last ran, where, how often, and its result."""
    rows = app.maintenance_status()
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=_json_default))
        return
    for row in rows:
        tick = row["last_tick"].isoformat(timespec="seconds") if row["last_tick"] else "never"
        click.echo(
            f"{row['routine']:9} runs {row['runs']:>5}  last tick {tick}  "
            f"{row['worker_id'] or '-'}  {row['result'] or ''}"
        )


@cli.command()
@database_options
@click.argument("revision", default="head")
@click.option("--downgrade", is_flag=True, help="Downgrade to REVISION (default: base).")
@click.option("--show", is_flag=True, help="Print the current and latest revision, change nothing.")
def migrate(app: App, revision: str, downgrade: bool, show: bool) -> None:
    """Create or upgrade the queue tables (the same migrations as `alembic upgrade head`)."""
    from . import migrate as migrations

    try:
        if show:
            with app.engine.connect() as conn:
                current = migrations.current_revision(conn, app.names)
            click.echo(f"current: {current or 'none'}  latest: {migrations.head_revision()}")
            return
        if downgrade:
            target = "base" if revision == "head" else revision
            migrations.downgrade(app.engine, app.names, target)
        else:
            migrations.upgrade(app.engine, app.names, revision)
    except sa.exc.OperationalError as exc:
        raise DatabaseUnavailableError(
            f"cannot migrate {redact(app.url)}: {str(exc.orig).strip().splitlines()[0]}"
        ) from None
    click.echo(f"{'downgraded' if downgrade else 'migrated'} {app.names.jobs} on {redact(app.url)}")


@cli.command()
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
def enqueue(app: App, task: str, payload: str, **options: Any) -> None:
    """Enqueue one job and print its id."""
    try:
        value = json.loads(payload)
    except ValueError as exc:
        raise ConfigurationError(
            f"--payload is not valid JSON ({exc}): e.g. '{{\"order\": 42}}'"
        ) from None
    click.echo(app.enqueue(None, task, value, **options))


@cli.command()
@database_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def stats(app: App, as_json: bool) -> None:
    """Jobs per queue and status, and how long the oldest runnable job has waited."""
    rows = app.stats()
    if as_json:
        click.echo(json.dumps([_stats_dict(r) for r in rows], indent=2))
        return
    if not rows:
        click.echo("no jobs")
        return
    statuses = ["available", "scheduled", "running", "succeeded", "dead", "cancelled"]
    click.echo(f"{'queue':20} " + " ".join(f"{s:>10}" for s in statuses) + "  oldest runnable")
    for row in rows:
        counts = _stats_dict(row)["counts"]
        age = "-" if row.oldest_runnable_age is None else f"{row.oldest_runnable_age:.1f}s"
        click.echo(
            f"{row.queue:20} " + " ".join(f"{counts.get(s, 0):>10}" for s in statuses) + f"  {age}"
        )


def _stats_dict(row: Any) -> dict[str, Any]:
    counts = dict(row.counts)
    # "available" counts jobs runnable now; those waiting for run_at are "scheduled".
    counts["available"] = counts.get("available", 0) - row.scheduled
    counts["scheduled"] = row.scheduled
    return {"queue": row.queue, "counts": counts, "oldest_runnable_age": row.oldest_runnable_age}


@cli.group()
def dead() -> None:
    """The morgue: jobs whose attempts are exhausted."""


@dead.command("list")
@database_options
@click.option("--queue")
@click.option("--limit", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def dead_list(app: App, queue: str | None, limit: int, as_json: bool) -> None:
    """List dead jobs, newest first."""
    rows = app.dead_jobs(queue, limit)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=_json_default))
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


@dead.command("requeue")
@database_options
@click.argument("ids", nargs=-1, type=int, required=True)
def dead_requeue(app: App, ids: tuple[int, ...]) -> None:
    """Run dead jobs again (attempts start over)."""
    done = app.requeue_dead(ids)
    missing = sorted(set(ids) - set(done))
    click.echo(f"requeued {len(done)}: {' '.join(map(str, done)) or '-'}")
    if missing:
        raise click.ClickException(f"not dead (or no such job): {' '.join(map(str, missing))}")


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return str(value)


def main() -> None:
    cli(prog_name="dbqueue")


__all__ = ["cli", "main", "Settings"]

"""``dbqueue`` command line: worker, migrate, enqueue, stats, dead, subscriptions, server,
cancel, result, job show."""

from __future__ import annotations

import datetime as dt
import functools
import importlib
import json
import logging
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import sqlalchemy as sa

from dbqueue.app.facade import App
from dbqueue.app.monitoring import STATUS_KEYS, stats_report
from dbqueue.app.morgue import MORGUE_ORDERS
from dbqueue.base.limits import parse_queue_limits
from dbqueue.cli import logs
from dbqueue.config import (
    DATABASE_VARIABLES,
    DEFAULT_SQLITE_FILE,
    DEFAULT_SQLITE_URL,
    Settings,
    env_first,
    parse_bool,
    parse_minutes,
    redact,
)
from dbqueue.dialects import resolve_url
from dbqueue.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    DbqueueError,
    JobCancelledError,
    JobFailedError,
    JobNotFinishedError,
)
from dbqueue.job import PUBLICATION_MARKER
from dbqueue.pubsub.subscriptions import (
    Subscription,
    parse_header,
    redact_headers,
    redact_url,
)
from dbqueue.runtime.cancellation import NOT_FOUND

#: Where the chosen log format is kept in click's context, for commands that print to stderr.
LOG_FORMAT = "dbqueue.log_format"
DIALECT_HELP = (
    "postgresql, mysql, singlestore or sqlite (with the DB_* variables, or to check --url)"
)


def _configure_logging(verbose: bool, log_format: str = "text") -> None:
    debug = verbose
    if not debug and os.environ.get("LOG_DEBUG"):
        debug = parse_bool(os.environ["LOG_DEBUG"], "LOG_DEBUG")
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        handlers=[logs.handler(log_format, sys.stderr)],
    )
    if log_format == "json":
        logging.captureWarnings(True)  # a warning's lines become one record too
    if debug:
        logging.getLogger("sqlalchemy.engine").setLevel(logging.WARNING)
        # urllib3 logs each webhook request line, query string (and any token in it) included.
        logging.getLogger("urllib3").setLevel(logging.INFO)


#: ``click.Context.meta`` key: the --app given (None: none), for commands that check names.
APP_SPEC = "dbqueue.app_spec"


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
    """--url, --dialect, --table-prefix, --schema, --app, -v and --log-format, shared by
    every command."""
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
        click.option(
            "--log-format",
            type=click.Choice(logs.LOG_FORMATS),
            default="text",
            show_default=True,
            envvar="DBQUEUE_LOG_FORMAT",
            help="json: one JSON object per log line (env DBQUEUE_LOG_FORMAT).",
        ),
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
        log_format: str,
        **kwargs: Any,
    ) -> Any:
        _configure_logging(verbose, log_format)
        click.get_current_context().meta[LOG_FORMAT] = log_format
        click.get_current_context().meta[APP_SPEC] = app_spec
        with OneLineErrors():
            app = build_app(url, dialect, table_prefix, schema, app_spec)
            default = default_database(app, url)
            if default is not None:
                creates = getattr(command, "creates_database", None)
                use_default_database(default, creates is not None and creates(kwargs))
            return command(app=app, **kwargs)

    return wrapper


def creates_database(when: Callable[[dict[str, Any]], bool]) -> Callable[..., Any]:
    """Mark a command that may create the default SQLite file (``when`` its options say so):
    every other command refuses a default file that does not exist instead of creating it."""

    def mark(command: Callable[..., Any]) -> Callable[..., Any]:
        command.creates_database = when  # type: ignore[attr-defined]
        return command

    return mark


def default_database(app: App, url: str | None) -> Path | None:
    """The default database's file, when nothing named a database: no --url, no DBQUEUE_URL
    or DB_* variables, no URL in the --app's App."""
    if url or env_first(os.environ, *DATABASE_VARIABLES) or app.url != DEFAULT_SQLITE_URL:
        return None
    return Path(DEFAULT_SQLITE_FILE).resolve()


def use_default_database(path: Path, creates: bool) -> None:
    """Say which database a command uses and why; refuse to create it by accident."""
    why = (
        f"the database is the default, {DEFAULT_SQLITE_URL} ({path}), as no --url, "
        "DBQUEUE_URL or DB_* variable names one"
    )
    if not path.exists() and not creates:
        raise ConfigurationError(
            f"{why}; it does not exist: pass --url or set DBQUEUE_URL to your database, or "
            "run `dbqueue migrate` to create the default one here"
        )
    click.echo(f"dbqueue: {why}", err=True)


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
        return app.reconfigured(url=resolved, table_prefix=table_prefix, schema=schema)
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
@click.option(
    "--queue-limit",
    "queue_limits",
    multiple=True,
    metavar="QUEUE=N",
    help="At most N jobs of QUEUE at once across all workers (repeatable; 1: exclusive).",
)
@click.option(
    "--concurrency",
    default=1,
    show_default=True,
    help="Jobs run at once, each on a connection of its own: threads, or slots on an event "
    "loop when the app has async def handlers (plain ones run on each slot's thread).",
)
@click.option("--burst", is_flag=True, help="Exit when nothing is runnable.")
@click.option("--max-jobs", type=int, help="Stop after this many jobs.")
@click.option("--max-runtime", type=float, help="Stop claiming after this many seconds.")
@click.option("--strategy", help="Claim strategy (env DBQUEUE_STRATEGY; default: the database's).")
@click.option(
    "--server",
    envvar="DBQUEUE_LOCK_SERVER",
    help="HOST:PORT of `dbqueue server`, for --strategy lock_server (env DBQUEUE_LOCK_SERVER).",
)
@click.option("--batch-size", default=10, show_default=True, help="Most jobs claimed at once.")
@click.option(
    "--poll-interval", type=float, help="Longest idle sleep, s (1; 30 with push wake-ups)."
)
@click.option("--min-poll-interval", default=0.05, show_default=True, help="First idle sleep, s.")
@click.option("--no-maintenance", is_flag=True, help="Take no part in purge/rescue/re-notify.")
@click.option(
    "--periodic/--no-periodic", default=True, help="Enqueue the --app's periodic schedules."
)
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
@click.option(
    "--job-timeout",
    type=float,
    envvar="DBQUEUE_JOB_TIMEOUT",
    help="Seconds a job may run (tasks' own timeout= wins); past it the attempt fails.",
)
@click.option(
    "--log-jobs/--no-log-jobs",
    default=None,
    help="One INFO line per finished job on logger dbqueue.jobs (env DBQUEUE_LOG_JOBS).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    envvar="DBQUEUE_METRICS_PORT",
    help="Serve this worker's Prometheus metrics on /metrics at this port (dbqueue[metrics]).",
)
@click.option(
    "--metrics-bind",
    default="0.0.0.0",
    show_default=True,
    envvar="DBQUEUE_METRICS_BIND",
    help="Address the metrics port listens on.",
)
@click.option(
    "--heartbeat-interval",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds between the worker's heartbeats in the registry of live workers.",
)
def worker(
    app: App,
    queues: tuple[str, ...],
    queue_limits: tuple[str, ...],
    no_maintenance: bool,
    rescue_minutes: Any,
    purge_minutes: Any,
    notify_minutes: Any,
    purge_max_age: float | None,
    purge_limit: int | None,
    wait_notify_interval: float | None,
    server: str | None,
    metrics_port: int | None,
    metrics_bind: str,
    **options: Any,
) -> None:
    """Run a worker until SIGTERM/SIGINT (or --burst / a limit)."""
    if metrics_port is not None:
        from dbqueue.observability import metrics

        metrics.serve(app, metrics_port, metrics_bind)
    app = app.reconfigured(
        lock_server=server,
        notify_server=server,
        rescue_minutes=rescue_minutes,
        purge_minutes=purge_minutes,
        notify_minutes=notify_minutes,
        purge_max_age_days=purge_max_age,
        purge_limit=purge_limit,
        wait_notify_interval=wait_notify_interval,
    )
    summary = app.run_worker(
        queues=list(queues) or None,
        queue_limits=parse_queue_limits(queue_limits),
        maintenance=not no_maintenance,
        **options,
    )
    if click.get_current_context().meta.get(LOG_FORMAT) != "json":  # JSON: the log line says it
        click.echo(
            f"worker stopped: {summary.succeeded} succeeded, {summary.failed} failed", err=True
        )


@cli.group()
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
    spec = click.get_current_context().meta.get(APP_SPEC)
    if spec and not app.registry.handles(task):
        known = ", ".join(name for name in app.registry.names() if app.registry.handles(name))
        raise ConfigurationError(
            f"unknown task {task!r}: --app {spec} registers {known or 'no task'}; enqueue one "
            "of those (without --app, any task name is accepted)"
        )
    click.echo(app.enqueue(None, task, value, **options))


@cli.command()
@database_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
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


@cli.command()
@database_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
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


@cli.command()
@database_options
@click.option(
    "--bind",
    default="127.0.0.1",
    show_default=True,
    envvar="DBQUEUE_SERVER_BIND",
    help="Address to listen on (0.0.0.0: every interface; then set a token).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8970,
    show_default=True,
    envvar="LOCK_SERVICE_PORT",
    help="Port for locks (LOCK_SERVICE_PORT; 0 picks a free one).",
)
@click.option(
    "--notify-port",
    type=click.IntRange(0, 65535),
    default=8770,
    show_default=True,
    envvar="NOTIFY_SERVICE_PORT",
    help="Second port, for idle workers (NOTIFY_SERVICE_PORT); both serve the same protocol.",
)
@click.option(
    "--max-clients",
    type=click.IntRange(1),
    default=50,
    show_default=True,
    envvar="MAX_CLIENT_THREADS",
    help="Connections served at once (MAX_CLIENT_THREADS).",
)
@click.option(
    "--check-tasks-interval",
    type=click.FloatRange(0, min_open=True),
    default=15.0,
    show_default=True,
    envvar="CHECK_TASKS_INTERVAL",
    help="Seconds between polls of the queue table (CHECK_TASKS_INTERVAL).",
)
@click.option(
    "--message-timeout",
    type=click.FloatRange(0, min_open=True),
    default=5.0,
    show_default=True,
    envvar="TIMEOUT_SOCKET_MESSAGE",
    help="Seconds a message may take to arrive whole (TIMEOUT_SOCKET_MESSAGE).",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(0, min_open=True),
    default=30.0,
    show_default=True,
    envvar="LOCK_SERVICE_WAIT_CONN_INTERVAL",
    help="Seconds a client may stay silent before it is dropped, its locks freed "
    "(LOCK_SERVICE_WAIT_CONN_INTERVAL; clients ping at a third of it).",
)
def server(
    app: App,
    bind: str,
    port: int,
    notify_port: int,
    max_clients: int,
    check_tasks_interval: float,
    message_timeout: float,
    idle_timeout: float,
) -> None:
    """Run the lock server: named locks and wake-ups over TCP (token: DBQUEUE_LOCK_SERVER_TOKEN)."""
    from dbqueue.lockserver.serve import serve
    from dbqueue.lockserver.server import ServerConfig

    serve(
        app.context,
        ServerConfig(
            bind=bind,
            port=port,
            notify_port=notify_port,
            token=os.environ.get("DBQUEUE_LOCK_SERVER_TOKEN") or None,
            max_clients=max_clients,
            message_timeout=message_timeout,
            idle_timeout=idle_timeout,
            check_interval=check_tasks_interval,
        ),
    )


@cli.command()
@database_options
@click.option(
    "--bind",
    default="127.0.0.1",
    show_default=True,
    envvar="DBQUEUE_DASHBOARD_BIND",
    help="Address to listen on; any other than loopback needs DBQUEUE_DASHBOARD_TOKEN "
    "or --read-only.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8787,
    show_default=True,
    envvar="DBQUEUE_DASHBOARD_PORT",
    help="Port to listen on.",
)
@click.option("--read-only", is_flag=True, help="No actions: the pages only read.")
def dashboard(app: App, bind: str, port: int, read_only: bool) -> None:
    """Serve the web dashboard (token: DBQUEUE_DASHBOARD_TOKEN; needs dbqueue[dashboard])."""
    try:
        import uvicorn

        from dbqueue.dashboard import create_app
    except ImportError as exc:
        raise ConfigurationError(
            f"the dashboard needs the dashboard extra ({exc}): pip install 'dbqueue[dashboard]'"
        ) from None
    token = os.environ.get("DBQUEUE_DASHBOARD_TOKEN") or None
    loopback = _is_loopback(bind)
    if not loopback and token is None and not read_only:
        raise ConfigurationError(
            f"--bind {bind} is not a loopback address: set DBQUEUE_DASHBOARD_TOKEN (every page "
            "and action then asks for it) or pass --read-only"
        )
    app.stats()  # reach the database (and its tables) before serving
    board = create_app(
        app, token=token, read_only=read_only, actions_without_token=loopback and token is None
    )
    click.echo(f"dbqueue dashboard on http://{bind}:{port}/", err=True)
    uvicorn.run(board, host=bind, port=port, log_level="warning")


def _is_loopback(bind: str) -> bool:
    import ipaddress

    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return False


@cli.group()
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


@cli.group()
def subscriptions() -> None:
    """Pub/sub subscriptions: who receives each topic (code, or a webhook)."""


@subscriptions.command("list")
@database_options
@click.option("--topic", help="Only this topic's subscriptions.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def subscriptions_list(app: App, topic: str | None, as_json: bool) -> None:
    """List subscriptions by topic (credentials in urls and headers are shown as ***)."""
    rows = app.subscriptions(topic)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in rows], indent=2, default=_json_default))
        return
    if not rows:
        click.echo("no subscriptions")
        return
    for sub in rows:
        click.echo(_describe_subscription(sub))


def _describe_subscription(sub: Subscription) -> str:
    target = f"{sub.method} {redact_url(sub.url)}" if sub.is_webhook else "code"
    filters = []
    if sub.tenant is not None:
        filters.append(f"tenant={sub.tenant}")
    if sub.business_group:
        filters.append(f"business_group={sub.business_group}")
    headers = redact_headers(sub.headers)
    if isinstance(headers, dict) and headers:
        filters.append("headers: " + ", ".join(f"{k}: {v}" for k, v in headers.items()))
    state = "active" if sub.active else "disabled"
    extra = f"  {'  '.join(filters)}" if filters else ""
    return f"{sub.id:24} {sub.topic:24} {state:8} {target}{extra}"


def one_subscription(name: str) -> Callable[[Callable[..., Any]], Any]:
    """``dbqueue subscriptions NAME SUBSCRIPTION_ID [options]``: a command on one subscription."""

    def register(command: Callable[..., Any]) -> Any:
        with_id = click.argument("subscription_id")(command)
        return subscriptions.command(name)(database_options(with_id))

    return register


#: ``subscriptions update`` option → the change it makes (``update_subscription``'s names).
CHANGE_NAMES = {"webhook_url": "url"}
#: ``--clear`` choices → the change that empties them.
CLEARABLE = {
    "tenant": "tenant",
    "business-group": "business_group",
    "webhook-url": "url",
    "headers": "headers",
}


@subscriptions.command("add")
@database_options
@click.argument("subscription_id")
@click.option("--topic", required=True, help="The topic (task name) to receive.")
@click.option("--tenant", type=int, help="Only publications for this tenant.")
@click.option("--business-group", help="Only publications for this business group.")
@click.option(
    "--webhook-url",
    "webhook_url",
    help="Deliveries become HTTP calls to this URL, no code needed (--url is the database's).",
)
@click.option("--method", default="POST", show_default=True, help="GET, POST or PUT.")
@click.option("--header", "headers", multiple=True, help="'Name: value' (repeatable).")
@click.option("--disabled", is_flag=True, help="Add it inactive.")
def subscriptions_add(
    app: App,
    subscription_id: str,
    topic: str,
    tenant: int | None,
    business_group: str | None,
    webhook_url: str | None,
    method: str,
    headers: tuple[str, ...],
    disabled: bool,
) -> None:
    """Subscribe SUBSCRIPTION_ID to a topic."""
    parsed = _parse_headers(headers)
    sub = app.add_subscription(
        None,
        subscription_id,
        topic,
        tenant=tenant,
        business_group=business_group,
        url=webhook_url,
        method=method,
        headers=parsed or None,
        active=not disabled,
    )
    click.echo(f"added {_describe_subscription(sub)}")


@one_subscription("disable")
def subscriptions_disable(app: App, subscription_id: str) -> None:
    """Stop a subscription receiving publications (pending webhook deliveries wait)."""
    sub = app.disable_subscription(None, subscription_id)
    click.echo(f"disabled subscription {sub.id} (topic {sub.topic})")


@one_subscription("enable")
def subscriptions_enable(app: App, subscription_id: str) -> None:
    """Let a disabled subscription receive publications again."""
    sub = app.enable_subscription(None, subscription_id)
    click.echo(f"enabled subscription {sub.id} (topic {sub.topic})")


def _parse_headers(headers: tuple[str, ...]) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for text in headers:
        name, value = parse_header(text)
        if name.lower() in (n.lower() for n in parsed):
            raise ConfigurationError(f"--header {name} is given twice: give each header once")
        parsed[name] = value
    return parsed


@one_subscription("update")
@click.option("--topic", help="Receive this topic instead.")
@click.option("--tenant", type=int, help="Only publications for this tenant.")
@click.option("--business-group", help="Only publications for this business group.")
@click.option("--webhook-url", "webhook_url", help="Deliver by HTTP to this URL.")
@click.option("--method", help="GET, POST or PUT.")
@click.option(
    "--header", "headers", multiple=True, help="'Name: value' (repeatable; replaces all)."
)
@click.option(
    "--clear",
    "cleared",
    multiple=True,
    type=click.Choice(sorted(CLEARABLE)),
    help="Empty this field (repeatable).",
)
def subscriptions_update(
    app: App, subscription_id: str, headers: tuple[str, ...], cleared: tuple[str, ...], **given: Any
) -> None:
    """Change a subscription; the options not given keep their values."""
    changes = {CHANGE_NAMES.get(k, k): v for k, v in given.items() if v is not None}
    if headers:
        changes["headers"] = _parse_headers(headers)
    for option in cleared:
        name = CLEARABLE[option]
        if name in changes:
            raise ConfigurationError(f"--clear {option} and a new value for it: give one of them")
        changes[name] = None
    if not changes:
        raise ConfigurationError(
            "nothing to change: give --topic, --tenant, --business-group, --webhook-url, "
            "--method, --header or --clear"
        )
    sub = app.update_subscription(None, subscription_id, **changes)
    click.echo(f"updated {_describe_subscription(sub)}")


@one_subscription("remove")
def subscriptions_remove(app: App, subscription_id: str) -> None:
    """Delete a subscription (its pending webhook deliveries fail their attempts)."""
    sub = app.remove_subscription(None, subscription_id)
    click.echo(f"removed subscription {sub.id} (topic {sub.topic})")


# ---- cancellation ------------------------------------------------------------------------------
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


@cli.command()
@database_options
@click.argument("ids", nargs=-1, type=int, required=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def cancel(app: App, ids: tuple[int, ...], as_json: bool) -> None:
    """Cancel jobs: waiting ones at once, running ones by request (their worker stops them
    within about a second); finished ones are left as they are. One line per job."""
    _print_cancelled(app.cancel(ids), as_json)


@cli.command("cancel-publication")
@database_options
@click.argument("publication_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
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


@cli.group()
def periodic() -> None:
    """Periodic schedules (declared in your --app) and the ticks they enqueued."""


@periodic.command("list")
@database_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def periodic_list(app: App, as_json: bool) -> None:
    """Each schedule: cron and tz, task and queue, last and next tick, the last job's status."""
    rows = app.periodic_status()
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=_json_default))
        return
    if not rows:
        hint = "" if click.get_current_context().meta.get(APP_SPEC) else " (pass --app)"
        click.echo(f"no periodic schedules{hint}")
        return
    unknown = "not in the --app" if click.get_current_context().meta.get(APP_SPEC) else "no --app"
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


# ---- results: dbqueue result, dbqueue job show -------------------------------------------------
class _JobError(click.ClickException):
    """One line, and an exit status that says why there is no result."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it a ClassVar


#: ``dbqueue result`` exit statuses (1: any other error, such as no such job).
RESULT_EXIT = {JobCancelledError: 4, JobFailedError: 3, JobNotFinishedError: 5}


@cli.command()
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


@cli.group()
def job() -> None:
    """One job, every column."""


@job.command("show")
@database_options
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def job_show(app: App, job_id: int, as_json: bool) -> None:
    """Every column of a job; its payload and result as indented JSON."""
    row = app.get_job(job_id)
    if row is None:
        raise click.ClickException(
            f"there is no job {job_id} in {app.names.qualified_jobs}: it was never enqueued "
            "there, or purged after its retention period"
        )
    if as_json:
        click.echo(json.dumps(row, indent=2, ensure_ascii=False, default=_json_default))
        return
    width = max(map(len, row))
    for name, value in row.items():
        if name in ("payload", "result"):
            text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
        else:
            text = "" if value is None else str(value)
        if "\n" in text:
            click.echo(f"{name}:")
            click.echo(textwrap.indent(text, "    "))
        else:
            click.echo(f"{name:<{width}}  {text}")


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return str(value)


def main() -> None:
    cli(prog_name="dbqueue")


__all__ = ["cli", "main", "Settings"]

"""``dbqueue worker``: run a worker with the App's handlers until it is stopped."""

from __future__ import annotations

from typing import Any

import click

from dbqueue.app.facade import App
from dbqueue.base.limits import parse_queue_limits
from dbqueue.cli.options import chosen_log_format, database_options
from dbqueue.config import parse_minutes
from dbqueue.errors import ConfigurationError
from dbqueue.worker.process import exit_now


def _minutes(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    try:
        return parse_minutes(value, param.opts[0])
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command()
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
    "--shutdown-timeout",
    type=float,
    envvar="DBQUEUE_SHUTDOWN_TIMEOUT",
    help="Seconds a stop waits for running jobs, then stops at once as a second "
    "SIGTERM/SIGINT does (default: as long as they run).",
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
    help="Serve this worker's Prometheus metrics on /metrics at this port (dbqueue-sql[metrics]).",
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
@click.option(
    "--transaction/--no-transaction",
    default=None,
    help="Run the jobs of tasks that do not choose inside their claim's transaction (the "
    "default) or outside it, under a lease (env DBQUEUE_TRANSACTION).",
)
@click.option(
    "--lease-seconds",
    type=float,
    envvar="DBQUEUE_LEASE_SECONDS",
    help="How long a job run outside its transaction stays this worker's without a heartbeat "
    "(default 60); rescue retries it after.",
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
    transaction: bool | None,
    **options: Any,
) -> None:
    """Run a worker until SIGTERM/SIGINT (or --burst / a limit); a second signal stops it at
    once."""
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
        transaction=transaction,
    )
    runner = app.worker(
        queues=list(queues) or None,
        queue_limits=parse_queue_limits(queue_limits),
        maintenance=not no_maintenance,
        **options,
    )
    summary = runner.run()
    if chosen_log_format() != "json":  # JSON: the log line says it
        click.echo(
            f"worker stopped: {summary.succeeded} succeeded, {summary.failed} failed", err=True
        )
    if runner.abandoned_threads_running:  # stopped at once: nothing of the worker may follow
        exit_now()

"""``dbqueue server``: the lock server, its ports, limits and timeouts (the seed's variables)."""

from __future__ import annotations

import os

import click

from dbqueue.app.facade import App
from dbqueue.cli.options import database_options


@click.command()
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
    from dbqueue.lockserver.config import ServerConfig
    from dbqueue.lockserver.serve import serve

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

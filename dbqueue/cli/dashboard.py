"""``dbqueue dashboard``: serve the web dashboard, refusing an open address without a token."""

from __future__ import annotations

import os

import click

from dbqueue.app.facade import App
from dbqueue.base.distribution import install_hint
from dbqueue.cli.options import database_options
from dbqueue.errors import ConfigurationError


@click.command()
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
    """Serve the web dashboard (token: DBQUEUE_DASHBOARD_TOKEN; needs dbqueue-sql[dashboard])."""
    try:
        import uvicorn

        from dbqueue.dashboard import create_app
    except ImportError as exc:
        raise ConfigurationError(
            f"the dashboard needs the dashboard extra ({exc}): {install_hint('dashboard')}"
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

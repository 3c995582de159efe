"""Running ``dbqueue server``: check the database, then serve until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

import sqlalchemy as sa

from .. import dialects
from ..config import redact
from ..errors import ConfigurationError, DatabaseUnavailableError
from ..migrate import check_schema
from .protocol import Address
from .server import LockServer, ServerConfig

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("dbqueue.lockserver")


def serve(app: App, config: ServerConfig) -> None:
    """Serve locks and wake-ups for ``app``'s queue tables until SIGTERM or SIGINT."""
    engine = app.create_engine(pool_size=1, max_overflow=1)
    try:
        try:
            with engine.connect() as conn:
                dialect = dialects.for_sqlalchemy(conn.dialect)
                dialect.check_connection(conn)
                check_schema(conn, app.names)
        except sa.exc.DBAPIError as exc:
            first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            raise DatabaseUnavailableError(
                f"cannot connect to {redact(app.url)}: {first} (the lock server polls the queue "
                "table; check --url / DBQUEUE_URL)"
            ) from None

        def poll() -> list[str]:
            with engine.connect() as conn:
                return app.queue_engine(conn).runnable_queues(conn)

        server = LockServer(config, poll)
        if config.token is None and not _loopback(config.bind):
            log.warning(
                "listening on %s without a token: any client that can reach it can take and "
                "hold locks; set DBQUEUE_LOCK_SERVER_TOKEN on the server and its clients",
                config.bind,
            )

        def ready(addresses: list[Address]) -> None:
            log.info(
                "lock server listening on %s; polling %s on %s every %gs; up to %d clients; %s",
                " and ".join(str(a) for a in addresses),
                app.names.qualified_jobs,
                dialect.server_description,
                config.check_interval,
                config.max_clients,
                "token required" if config.token else "no token",
            )

        asyncio.run(_main(server, ready))
        log.info("lock server stopped")
    finally:
        engine.dispose()


async def _main(server: LockServer, ready: Callable[[list[Address]], None]) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, server.stop)
    try:
        await server.run(ready)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot listen on {server.config.bind} port {server.config.port} or "
            f"{server.config.notify_port}: {exc.strerror or exc} (is another server running? "
            "choose other ports with --port / --notify-port)"
        ) from None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

"""Running ``dbqueue server``: check the database, then serve until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

from dbqueue.errors import ConfigurationError
from dbqueue.lockserver.config import ServerConfig
from dbqueue.lockserver.protocol import Address
from dbqueue.lockserver.server import LockServer

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext

log = logging.getLogger("dbqueue.lockserver")


def serve(context: RuntimeContext, config: ServerConfig) -> None:
    """Serve locks and wake-ups for the context's queue tables until SIGTERM or SIGINT."""
    engine = context.create_engine(pool_size=1, max_overflow=1)
    try:
        dialect = context.check_database(engine)  # the server polls the queue table

        def poll() -> list[str]:
            with engine.connect() as conn:
                return context.queue_engine(conn).queries.runnable_queues(conn)

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
                context.names.qualified_jobs,
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

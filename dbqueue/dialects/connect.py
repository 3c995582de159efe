"""From configuration to a SQLAlchemy engine: which URL, and an engine set up the way dbqueue
needs it on that database (each dialect module's engine options and connect-time settings)."""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

from dbqueue.base.distribution import DISTRIBUTION, install_hint
from dbqueue.config import DEFAULT_SQLITE_URL, env_first, parse_number, parse_url
from dbqueue.dialects.base import Dialect
from dbqueue.dialects.poollog import quiet_reset_failures
from dbqueue.dialects.registry import DIALECT_NAMES, class_for_name, class_for_url
from dbqueue.errors import ConfigurationError


def resolve_url(
    url: str | None, dialect: str | None, environ: Mapping[str, str] | None = None
) -> str:
    """The database URL: ``url``, else DBQUEUE_URL, else the seed's DB_*/DATABASE_* variables
    with ``dialect``, else a SQLite file ``dbqueue.db`` in the working directory."""
    env = os.environ if environ is None else environ
    if dialect is not None and dialect not in DIALECT_NAMES:
        raise ConfigurationError(
            f"unknown dialect {dialect!r}: choose one of {', '.join(DIALECT_NAMES)}"
        )
    chosen = url or env_first(env, "DBQUEUE_URL")
    if chosen:
        parsed = parse_url(chosen)
        if dialect is not None:
            actual = class_for_url(parsed).name
            if actual != dialect:
                raise ConfigurationError(
                    f"--dialect {dialect} does not match the URL, which is for {actual}: "
                    "drop --dialect or fix the URL"
                )
        return chosen
    host = env_first(env, "DB_HOST", "DATABASE_HOST")
    database = env_first(env, "DB_BASE", "DATABASE_NAME")
    if host is None and database is None:
        if dialect not in (None, "sqlite"):
            raise ConfigurationError(
                f"--dialect {dialect} needs a server: pass --url, set DBQUEUE_URL, or set "
                "DB_HOST/DB_PORT/DB_BASE/DB_USER/DB_PASS"
            )
        return DEFAULT_SQLITE_URL
    cls = class_for_name(dialect or "postgresql")  # the seed's own database by default
    if cls.url_driver == "sqlite":
        return f"sqlite:///{database or 'dbqueue.db'}"
    port = env_first(env, "DB_PORT", "DATABASE_PORT")
    built = sa.engine.URL.create(
        cls.url_driver,
        username=env_first(env, "DB_USER", "DATABASE_USER"),
        password=env_first(env, "DB_PASS", "DATABASE_PASS"),
        host=host or "127.0.0.1",
        port=parse_number(port, "DB_PORT", int, 1) if port else cls.default_port,
        database=database,
    )
    return built.render_as_string(hide_password=False)


def _missing_driver(cls: type[Dialect], url: sa.engine.URL, exc: Exception) -> str:
    """One line naming the driver to use instead: the one dbqueue installs."""
    problem = str(exc).strip().splitlines()[0]
    usable = cls.normalize_url(url.set(drivername=url.drivername.partition("+")[0])).drivername
    if usable == cls.normalize_url(url).drivername:  # dbqueue's own driver is missing
        return f"cannot use {url!r}: {problem}; reinstall {DISTRIBUTION}, which requires it"
    return f"cannot use {url!r}: {problem}; use {usable}:// (the driver dbqueue installs)"


#: The pools of the engines made here (an Engine with execution options shares its original's).
_CONFIGURED: weakref.WeakSet[Any] = weakref.WeakSet()


def is_configured(engine: Engine) -> bool:
    """Whether ``engine`` was made by ``create_engine`` below (so set up the way dbqueue needs
    it), rather than given by the application."""
    return engine.pool in _CONFIGURED


def create_engine(url: str | sa.engine.URL, **kwargs: Any) -> Engine:
    """A new engine on ``url``'s database, configured the way dbqueue needs it."""
    parsed = parse_url(url) if isinstance(url, str) else url
    cls = class_for_url(parsed)
    parsed = sync_url(parsed, cls)
    cls.check_url(parsed)
    options = {**cls.engine_kwargs(), **kwargs}
    # The dialect's pre-ping, unless the caller chose: only for connections idle a while.
    ping_when_idle = options.get("pool_pre_ping") is True and "pool_pre_ping" not in kwargs
    if ping_when_idle:
        options["pool_pre_ping"] = False
    try:
        engine = sa.create_engine(cls.normalize_url(parsed), **options)
    except (sa.exc.NoSuchModuleError, ImportError) as exc:  # a driver that is not installed
        raise ConfigurationError(_missing_driver(cls, parsed, exc)) from None
    except sa.exc.ArgumentError as exc:
        raise ConfigurationError(f"cannot create an engine for {parsed!r}: {exc}") from None
    cls.configure_engine(engine)
    if ping_when_idle:
        _ping_when_idle(engine)
    quiet_reset_failures(engine)
    _CONFIGURED.add(engine.pool)
    return engine


#: A pooled connection returned less than this long ago is handed out without a ping.
PING_AFTER_IDLE = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """SQLAlchemy's ``pool_pre_ping``, for connections that sat in the pool over
    PING_AFTER_IDLE seconds. A ping is a round trip on every checkout: a third of a one-job
    ``app.enqueue(None, …)`` on a server database. It finds connections the server closed
    while they were idle (a restart, an idle timeout); a connection used a moment ago was
    alive then, and a server restart takes longer than that. A connection that does die
    meanwhile fails its next statement, and SQLAlchemy then replaces the pool's connections,
    as it does for one that dies while checked out."""

    @sa.event.listens_for(engine, "connect")
    def connected(dbapi_connection: Any, record: Any) -> None:
        record.info[_RETURNED] = time.monotonic()

    @sa.event.listens_for(engine, "checkin")
    def returned(dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info[_RETURNED] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        since = record.info.get(_RETURNED)
        if since is not None and time.monotonic() - since < PING_AFTER_IDLE:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # the pool retries with a new connection
            raise sa.exc.DisconnectionError(f"ping failed: {exc}") from exc


_RETURNED = "dbqueue_returned_at"


def create_async_engine(url: str | sa.engine.URL, **kwargs: Any) -> AsyncEngine:
    """An asyncio engine on ``url``'s database (its async driver, ``dbqueue-sql[asyncio]``), set up
    like ``create_engine``'s: the same options and connect-time hooks, on its sync_engine."""
    parsed = parse_url(url) if isinstance(url, str) else url
    cls = class_for_url(parsed)
    cls.check_url(parsed)
    async_url = parsed if _names_async_driver(parsed) else cls.async_url(parsed)
    if async_url is None:
        raise ConfigurationError(
            f"{cls.name} has no asyncio driver: async handlers and async enqueue run on "
            "PostgreSQL, MySQL/MariaDB and SQLite; make the handler a plain def"
        )
    options = {**cls.engine_kwargs(), **kwargs}
    try:
        from sqlalchemy.ext.asyncio import create_async_engine as sa_create_async_engine

        engine = sa_create_async_engine(async_url, **options)
    except (sa.exc.NoSuchModuleError, ImportError) as exc:
        raise ConfigurationError(
            f"async handlers on {cls.name} need the {cls.async_driver} driver "
            f"({str(exc).strip().splitlines()[0]}): {install_hint('asyncio')}"
        ) from None
    cls.configure_engine(engine.sync_engine)
    quiet_reset_failures(engine.sync_engine)
    _CONFIGURED.add(engine.sync_engine.pool)
    return engine


def sync_url(url: sa.engine.URL, cls: type[Dialect] | None = None) -> sa.engine.URL:
    """``url`` where a sync engine is needed: one naming an asyncio driver (an App's async URL
    given as its URL) becomes the same URL with that driver's sync counterpart, or is refused:
    a sync engine on an asyncio driver fails at its first statement (MissingGreenlet)."""
    if not _names_async_driver(url):
        return url
    cls = cls or class_for_url(url)
    sync = cls.sync_url(url)
    if sync is None:
        raise ConfigurationError(
            f"{url.drivername}:// is an asyncio driver, and a sync engine is needed here: give "
            f"the URL with a sync driver ({cls.url_driver}://…) and the asyncio one as async_url"
        )
    return sync


def _names_async_driver(url: sa.engine.URL) -> bool:
    """Whether ``url`` already names an asyncio driver (mysql+asyncmy://): kept as it is."""
    try:
        return bool(url.get_dialect().is_async)
    except (sa.exc.NoSuchModuleError, ImportError):
        return False

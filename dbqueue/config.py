"""Configuration: explicit arguments, then environment variables (dbqueue's and the seed's).

The seed library (nsj-queue-lib) was configured only by environment variables; their names keep
working so a worker can be moved over without touching its deployment.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from dbqueue.errors import ConfigurationError

#: Where the queue lives when nothing names a database: a SQLite file in the working directory.
DEFAULT_SQLITE_FILE = "dbqueue.db"
DEFAULT_SQLITE_URL = f"sqlite:///{DEFAULT_SQLITE_FILE}"
#: The variables that name a database when no URL is given (read by ``dialects.resolve_url``).
DATABASE_VARIABLES = ("DBQUEUE_URL", "DB_HOST", "DATABASE_HOST", "DB_BASE", "DATABASE_NAME")

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def env_first(environ: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = environ.get(name)
        if value is not None and value != "":
            return value
    return None


def parse_bool(value: str, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigurationError(f"{name}={value!r} is not a boolean: use true or false")


def parse_number(value: str, name: str, kind: type = float, minimum: float | None = 0) -> Any:
    try:
        number = kind(value)
    except ValueError:
        raise ConfigurationError(
            f"{name}={value!r} is not a {'whole ' if kind is int else ''}number"
        ) from None
    if minimum is not None and number < minimum:
        raise ConfigurationError(f"{name}={value!r} must be at least {minimum}")
    return number


def parse_minutes(value: str, name: str) -> tuple[int, ...]:
    """The seed's crontab-style minute lists, e.g. "0,5,10" or "*/5"."""
    text = value.strip()
    if text.startswith("*/"):
        step = parse_number(text[2:], name, int, minimum=1)
        return tuple(range(0, 60, step))
    minutes = []
    for part in text.split(","):
        minute = parse_number(part.strip(), name, int, minimum=0)
        if minute > 59:
            raise ConfigurationError(f"{name}={value!r}: minute {minute} is not within 0-59")
        minutes.append(minute)
    if not minutes:
        raise ConfigurationError(f"{name}={value!r}: give at least one minute, e.g. 0,30")
    return tuple(sorted(set(minutes)))


@dataclass(frozen=True)
class Settings:
    """Everything an App or a worker can be configured with; None means "use the default".

    Frozen: what depends on it (table names, defaults, the strategy) is derived once, by the
    runtime context; a change is a new Settings (``merged``) and so a new context."""

    url: str | None = None
    # The asyncio URL of the same database (aenqueue's own transactions); None: derived from
    # ``url`` with the database's asyncio driver (postgresql+asyncpg, mysql+aiomysql, ...).
    async_url: str | None = None
    dialect: str | None = None
    table_prefix: str | None = None
    schema: str | None = None
    jobs_table: str | None = None
    subscriptions_table: str | None = None
    queue: str | None = None
    max_attempts: int | None = None
    retry_base_interval: float | None = None  # seconds
    max_payload_bytes: int | None = None
    log_debug: bool = False
    strategy: str | None = None
    poll_interval: float | None = None  # seconds; longest idle sleep while polling
    wait_notify_interval: float | None = None  # seconds; longest idle sleep with push wake-ups
    rescue_minutes: tuple[int, ...] | None = None
    purge_minutes: tuple[int, ...] | None = None
    notify_minutes: tuple[int, ...] | None = None
    purge_max_age_days: float | None = None
    purge_limit: int | None = None
    maintenance_tick: float | None = None  # seconds per "minute" of the schedules (tests)
    # The lock server (client side): HOST:PORT for locks, and for wake-ups (the seed's two
    # services), a shared token, and the timeout of every message (TIMEOUT_SOCKET_MESSAGE).
    lock_server: str | None = None
    notify_server: str | None = None
    lock_server_token: str | None = None
    socket_timeout: float | None = None
    webhook_timeout: float | None = None  # seconds; the seed's DEFAULT_WEBHOOK_TIMEOUT
    job_timeout: float | None = None  # seconds a job may run unless its task says otherwise
    # Whether jobs of tasks that do not choose run inside their claim's transaction (True) or
    # outside it under a lease (False), and how long a lease lasts unless heartbeated.
    transaction: bool | None = None
    lease_seconds: float | None = None
    # Seconds a stopping worker waits for its running jobs before it stops at once.
    shutdown_timeout: float | None = None
    log_jobs: bool = False  # one INFO line per finished job (logger dbqueue.jobs)
    # Eager mode: run each job in the enqueuing process when its transaction commits (tests,
    # development); eager_raise: a job that dies there raises EagerJobError to the caller.
    eager: bool = False
    eager_raise: bool = False
    # Tenant databases: engines kept at once (an LRU cache), connections each keeps idle.
    tenant_cache_size: int | None = None
    tenant_pool_size: int | None = None
    # The seed's multi-database mode: tenant → database credentials from an HTTP API behind
    # an OAuth token (MULTI_DATABASE*, OAUTH_TOKEN_URL). Secrets stay out of reprs.
    multi_database: bool = False
    multi_database_user: str | None = None
    multi_database_password: str | None = field(default=None, repr=False)
    multi_database_client_id: str | None = None
    multi_database_credentials_url: str | None = None
    oauth_token_url: str | None = None
    # Grafana Loki log shipping (the seed's GRAFANA_URL, labelled with ENV).
    grafana_url: str | None = None
    env: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {
            "url": env_first(env, "DBQUEUE_URL"),
            "async_url": env_first(env, "DBQUEUE_ASYNC_URL"),
            "dialect": env_first(env, "DBQUEUE_DIALECT", "DB_DIALECT"),
            "table_prefix": env.get("DBQUEUE_TABLE_PREFIX"),
            "schema": env_first(env, "DBQUEUE_SCHEMA"),
            "jobs_table": env_first(env, "QUEUE_TABLE"),
            "subscriptions_table": env_first(env, "QUEUE_SUBSCRIBER_TABLE"),
            "queue": env_first(env, "QUEUE_NAME"),
            "strategy": env_first(env, "DBQUEUE_STRATEGY"),
        }
        values.update(_seed_retries_from_env(env))
        if (v := env_first(env, "DBQUEUE_MAX_PAYLOAD_BYTES")) is not None:
            values["max_payload_bytes"] = parse_number(v, "DBQUEUE_MAX_PAYLOAD_BYTES", int, 1)
        if (v := env_first(env, "LOG_DEBUG")) is not None:
            values["log_debug"] = parse_bool(v, "LOG_DEBUG")
        if (v := env_first(env, "DBQUEUE_LOG_JOBS")) is not None:
            values["log_jobs"] = parse_bool(v, "DBQUEUE_LOG_JOBS")
        for attribute, variable in (
            ("eager", "DBQUEUE_EAGER"),
            ("eager_raise", "DBQUEUE_EAGER_RAISE"),
            ("transaction", "DBQUEUE_TRANSACTION"),
        ):
            if (v := env_first(env, variable)) is not None:
                values[attribute] = parse_bool(v, variable)
        for attribute, (variable, kind) in _NUMBERS.items():
            if (v := env_first(env, variable)) is not None:
                values[attribute] = parse_number(v, variable, kind, minimum=0)
        if (v := env_first(env, "DEFAULT_WEBHOOK_TIMEOUT")) is not None:
            values["webhook_timeout"] = parse_number(v, "DEFAULT_WEBHOOK_TIMEOUT", minimum=0.001)
        for attribute, variable in _MINUTES.items():
            if (v := env_first(env, variable)) is not None:
                values[attribute] = parse_minutes(v, variable)
        values.update(_lock_server_from_env(env, values["strategy"]))
        values.update(_tenants_from_env(env))
        return cls(**values)

    def merged(self, **overrides: Any) -> Settings:
        """A copy where each non-None override replaces the setting."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})


_NUMBERS = {
    "poll_interval": ("DBQUEUE_POLL_INTERVAL", float),
    "wait_notify_interval": ("QUEUE_WAIT_NOTIFY_INTERVAL", float),
    "purge_max_age_days": ("QUEUE_PURGE_MAX_AGE", float),
    "purge_limit": ("QUEUE_PURGE_LIMIT", int),
    "maintenance_tick": ("DBQUEUE_MAINTENANCE_TICK", float),
    "job_timeout": ("DBQUEUE_JOB_TIMEOUT", float),
    "lease_seconds": ("DBQUEUE_LEASE_SECONDS", float),
    "shutdown_timeout": ("DBQUEUE_SHUTDOWN_TIMEOUT", float),
}
_MINUTES = {
    "rescue_minutes": "QUEUE_MINUTE_RETRY_THREAD",
    "purge_minutes": "QUEUE_MINUTE_PURGE_THREAD",
    "notify_minutes": "QUEUE_MINUTE_NOTIFY_THREAD",
}


#: The seed's retry defaults (nsj-queue-lib's README): QUEUE_MAX_RETRY=100 attempts, and
#: QUEUE_BASE_INTERVAL_RETRY=5 minutes × the attempt number between them.
SEED_MAX_ATTEMPTS = 100
SEED_BASE_INTERVAL = 300.0


def seed_retries(settings: Settings) -> Settings:
    """``settings`` with the seed's retry rule wherever they set none: its attempts, and its
    linear backoff (a base interval) instead of dbqueue's polynomial one."""
    return settings.merged(
        max_attempts=settings.max_attempts or SEED_MAX_ATTEMPTS,
        retry_base_interval=SEED_BASE_INTERVAL
        if settings.retry_base_interval is None
        else settings.retry_base_interval,
    )


def _seed_retries_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """QUEUE_MAX_RETRY and QUEUE_BASE_INTERVAL_RETRY (minutes): a deployment that sets either
    is configured the seed's way and gets the seed's defaults for the other."""
    attempts = env_first(env, "QUEUE_MAX_RETRY")
    minutes = env_first(env, "QUEUE_BASE_INTERVAL_RETRY")
    if attempts is None and minutes is None:
        return {}
    return {
        "max_attempts": SEED_MAX_ATTEMPTS
        if attempts is None
        else parse_number(attempts, "QUEUE_MAX_RETRY", int, minimum=1),
        "retry_base_interval": SEED_BASE_INTERVAL
        if minutes is None
        else 60 * parse_number(minutes, "QUEUE_BASE_INTERVAL_RETRY"),
    }


def _lock_server_from_env(env: Mapping[str, str], strategy: str | None) -> dict[str, Any]:
    """DBQUEUE_LOCK_SERVER, else the seed's client-server variables: CLIENT_SERVER_MODE=true
    makes lock_server the strategy, SERVER_HOST + LOCK_SERVICE_PORT / NOTIFY_SERVICE_PORT
    the addresses of its two services."""
    values: dict[str, Any] = {"lock_server_token": env_first(env, "DBQUEUE_LOCK_SERVER_TOKEN")}
    if (v := env_first(env, "TIMEOUT_SOCKET_MESSAGE")) is not None:
        values["socket_timeout"] = parse_number(v, "TIMEOUT_SOCKET_MESSAGE", float, minimum=0.1)
    mode = env_first(env, "CLIENT_SERVER_MODE")
    client_server = parse_bool(mode, "CLIENT_SERVER_MODE") if mode is not None else False
    if client_server and strategy is None:
        values["strategy"] = "lock_server"
    explicit = env_first(env, "DBQUEUE_LOCK_SERVER")
    seed = ("SERVER_HOST", "LOCK_SERVICE_PORT", "NOTIFY_SERVICE_PORT")
    if explicit:
        values["lock_server"] = values["notify_server"] = explicit
    elif client_server or any(env_first(env, name) for name in seed):
        host = env_first(env, "SERVER_HOST") or "127.0.0.1"
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host  # IPv6
        lock_port = env_first(env, "LOCK_SERVICE_PORT") or "8970"
        notify_port = env_first(env, "NOTIFY_SERVICE_PORT") or "8770"
        parse_number(lock_port, "LOCK_SERVICE_PORT", int, minimum=1)
        parse_number(notify_port, "NOTIFY_SERVICE_PORT", int, minimum=1)
        values["lock_server"] = f"{host}:{lock_port}"
        values["notify_server"] = f"{host}:{notify_port}"
    return values


def _tenants_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The seed's multi-database variables (names kept, the misspelt CREDETIALS included),
    dbqueue's tenant cache settings, and the Grafana ones."""
    values: dict[str, Any] = {
        "multi_database_user": env_first(env, "MULTI_DATABASE_USER"),
        "multi_database_password": env_first(env, "MULTI_DATABASE_PASSWORD"),
        "multi_database_client_id": env_first(env, "MULTI_DATABASE_CLIENT_ID"),
        "multi_database_credentials_url": env_first(env, "MULTI_DATABASE_API_CREDETIALS_URL"),
        "oauth_token_url": env_first(env, "OAUTH_TOKEN_URL"),
        "grafana_url": env_first(env, "GRAFANA_URL"),
        "env": env_first(env, "ENV"),
    }
    if (v := env_first(env, "MULTI_DATABASE")) is not None:
        values["multi_database"] = parse_bool(v, "MULTI_DATABASE")
    for attribute, variable in (
        ("tenant_cache_size", "DBQUEUE_TENANT_CACHE_SIZE"),
        ("tenant_pool_size", "DBQUEUE_TENANT_POOL_SIZE"),
    ):
        if (v := env_first(env, variable)) is not None:
            values[attribute] = parse_number(v, variable, int, minimum=1)
    return values


def parse_url(url: str) -> sa.engine.URL:
    try:
        return sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise ConfigurationError(
            f"cannot parse database URL {redact(url)!r} ({exc}): use the form "
            "dialect+driver://user:password@host:port/database, e.g. "
            "postgresql+psycopg2://app@127.0.0.1:5432/app or sqlite:///dbqueue.db"
        ) from None


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL: hide anything between ':' and '@'
        head, sep, tail = url.rpartition("@")
        if not sep:
            return url
        scheme, _, userinfo = head.partition("://")
        user = userinfo.split(":", 1)[0]
        return f"{scheme}://{user}:***@{tail}"


EVERY_5_MINUTES = tuple(range(0, 60, 5))


@dataclass(frozen=True)
class MaintenanceSettings:
    """When routines run and what purge keeps (the seed's QUEUE_* variables)."""

    rescue_minutes: tuple[int, ...] = EVERY_5_MINUTES  # QUEUE_MINUTE_RETRY_THREAD
    purge_minutes: tuple[int, ...] = (0,)  # QUEUE_MINUTE_PURGE_THREAD
    notify_minutes: tuple[int, ...] = EVERY_5_MINUTES  # QUEUE_MINUTE_NOTIFY_THREAD
    purge_max_age_days: float = 60.0  # QUEUE_PURGE_MAX_AGE
    purge_limit: int = 1000  # QUEUE_PURGE_LIMIT
    #: Length of a tick; 60 makes the minute lists mean clock minutes. Tests shorten it.
    tick_seconds: float = 60.0

    @classmethod
    def from_settings(cls, settings: Settings) -> MaintenanceSettings:
        """The configured schedules and retention, the defaults where none is set."""
        s, defaults = settings, cls()
        return cls(
            rescue_minutes=s.rescue_minutes or defaults.rescue_minutes,
            purge_minutes=s.purge_minutes or defaults.purge_minutes,
            notify_minutes=s.notify_minutes or defaults.notify_minutes,
            purge_max_age_days=defaults.purge_max_age_days
            if s.purge_max_age_days is None
            else s.purge_max_age_days,
            purge_limit=s.purge_limit or defaults.purge_limit,
            tick_seconds=s.maintenance_tick or defaults.tick_seconds,
        )

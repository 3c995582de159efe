"""Configuration: explicit arguments, then environment variables (dbqueue's and the seed's).

The seed library (nsj-queue-lib) was configured only by environment variables; their names keep
working so a worker can be moved over without touching its deployment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import sqlalchemy as sa

from .errors import ConfigurationError

DEFAULT_SQLITE_URL = "sqlite:///dbqueue.db"

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


@dataclass
class Settings:
    """Everything an App or a worker can be configured with; None means "use the default"."""

    url: str | None = None
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

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        settings = cls(
            url=env_first(env, "DBQUEUE_URL"),
            dialect=env_first(env, "DBQUEUE_DIALECT", "DB_DIALECT"),
            table_prefix=env.get("DBQUEUE_TABLE_PREFIX"),
            schema=env_first(env, "DBQUEUE_SCHEMA"),
            jobs_table=env_first(env, "QUEUE_TABLE"),
            subscriptions_table=env_first(env, "QUEUE_SUBSCRIBER_TABLE"),
            queue=env_first(env, "QUEUE_NAME"),
        )
        if (v := env_first(env, "QUEUE_MAX_RETRY")) is not None:
            settings.max_attempts = parse_number(v, "QUEUE_MAX_RETRY", int, minimum=1)
        if (v := env_first(env, "QUEUE_BASE_INTERVAL_RETRY")) is not None:
            settings.retry_base_interval = 60 * parse_number(v, "QUEUE_BASE_INTERVAL_RETRY")
        if (v := env_first(env, "DBQUEUE_MAX_PAYLOAD_BYTES")) is not None:
            settings.max_payload_bytes = parse_number(v, "DBQUEUE_MAX_PAYLOAD_BYTES", int, 1)
        if (v := env_first(env, "LOG_DEBUG")) is not None:
            settings.log_debug = parse_bool(v, "LOG_DEBUG")
        settings.strategy = env_first(env, "DBQUEUE_STRATEGY")
        numbers = {
            "poll_interval": ("DBQUEUE_POLL_INTERVAL", float),
            "wait_notify_interval": ("QUEUE_WAIT_NOTIFY_INTERVAL", float),
            "purge_max_age_days": ("QUEUE_PURGE_MAX_AGE", float),
            "purge_limit": ("QUEUE_PURGE_LIMIT", int),
            "maintenance_tick": ("DBQUEUE_MAINTENANCE_TICK", float),
            "job_timeout": ("DBQUEUE_JOB_TIMEOUT", float),
        }
        for attribute, (variable, kind) in numbers.items():
            if (v := env_first(env, variable)) is not None:
                setattr(settings, attribute, parse_number(v, variable, kind, minimum=0))
        if (v := env_first(env, "DEFAULT_WEBHOOK_TIMEOUT")) is not None:
            settings.webhook_timeout = parse_number(v, "DEFAULT_WEBHOOK_TIMEOUT", minimum=0.001)
        minutes = {
            "rescue_minutes": "QUEUE_MINUTE_RETRY_THREAD",
            "purge_minutes": "QUEUE_MINUTE_PURGE_THREAD",
            "notify_minutes": "QUEUE_MINUTE_NOTIFY_THREAD",
        }
        for attribute, variable in minutes.items():
            if (v := env_first(env, variable)) is not None:
                setattr(settings, attribute, parse_minutes(v, variable))
        settings._lock_server_from_env(env)
        return settings

    def _lock_server_from_env(self, env: Mapping[str, str]) -> None:
        """DBQUEUE_LOCK_SERVER, else the seed's client-server variables: CLIENT_SERVER_MODE=true
        makes lock_server the strategy, SERVER_HOST + LOCK_SERVICE_PORT / NOTIFY_SERVICE_PORT
        the addresses of its two services."""
        self.lock_server_token = env_first(env, "DBQUEUE_LOCK_SERVER_TOKEN")
        if (v := env_first(env, "TIMEOUT_SOCKET_MESSAGE")) is not None:
            self.socket_timeout = parse_number(v, "TIMEOUT_SOCKET_MESSAGE", float, minimum=0.1)
        mode = env_first(env, "CLIENT_SERVER_MODE")
        client_server = parse_bool(mode, "CLIENT_SERVER_MODE") if mode is not None else False
        if client_server and self.strategy is None:
            self.strategy = "lock_server"
        explicit = env_first(env, "DBQUEUE_LOCK_SERVER")
        seed = ("SERVER_HOST", "LOCK_SERVICE_PORT", "NOTIFY_SERVICE_PORT")
        if explicit:
            self.lock_server = self.notify_server = explicit
        elif client_server or any(env_first(env, name) for name in seed):
            host = env_first(env, "SERVER_HOST") or "127.0.0.1"
            host = f"[{host}]" if ":" in host and not host.startswith("[") else host  # IPv6
            lock_port = env_first(env, "LOCK_SERVICE_PORT") or "8970"
            notify_port = env_first(env, "NOTIFY_SERVICE_PORT") or "8770"
            parse_number(lock_port, "LOCK_SERVICE_PORT", int, minimum=1)
            parse_number(notify_port, "NOTIFY_SERVICE_PORT", int, minimum=1)
            self.lock_server = f"{host}:{lock_port}"
            self.notify_server = f"{host}:{notify_port}"

    def merged(self, **overrides: Any) -> Settings:
        """A copy where each non-None override replaces the setting."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return Settings(**values)


def resolve_url(
    url: str | None, dialect: str | None, environ: Mapping[str, str] | None = None
) -> str:
    """The database URL: ``url``, else DBQUEUE_URL, else the seed's DB_*/DATABASE_* variables
    with ``dialect``, else a SQLite file ``dbqueue.db`` in the working directory."""
    from .dialects import BY_NAME, DIALECT_NAMES

    env = os.environ if environ is None else environ
    if dialect is not None and dialect not in DIALECT_NAMES:
        raise ConfigurationError(
            f"unknown dialect {dialect!r}: choose one of {', '.join(DIALECT_NAMES)}"
        )
    chosen = url or env_first(env, "DBQUEUE_URL")
    if chosen:
        parsed = parse_url(chosen)
        if dialect is not None:
            from .dialects import class_for_url

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
    name = dialect or "postgresql"  # the seed's own database
    if name not in BY_NAME:
        raise ConfigurationError(
            f"dialect {name!r} needs its optional driver: pip install 'dbqueue[{name}]'"
        )
    cls = BY_NAME[name]
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

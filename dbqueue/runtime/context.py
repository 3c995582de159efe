"""The runtime context: everything a queue needs at run time, resolved once from its settings.

The App (user-facing calls), the worker, maintenance, the lock server and the CLI all work from
one context instead of reaching into each other: the frozen settings, the table names, the
engine factory, the lifecycle engine per database, the claim strategy (resolved here and
nowhere else), the retry policy and the start-up checks. A change of settings is a new context
(``reconfigured``), so nothing derived from the old settings survives by accident.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dbqueue import dialects, strategies
from dbqueue.base import payload as payload_codec
from dbqueue.base.identifiers import check_queue_name
from dbqueue.base.wakeup import LocalWorkers, Notifier
from dbqueue.config import MaintenanceSettings, Settings, redact
from dbqueue.engine import QueueEngine
from dbqueue.engine.cancels import RequestStore, request_store
from dbqueue.engine.instruments import Instruments
from dbqueue.errors import ConfigurationError, DatabaseUnavailableError
from dbqueue.pubsub.subscriptions import SubscriptionStore
from dbqueue.pubsub.webhooks import DEFAULT_WEBHOOK_TIMEOUT, WebhookHandler, WebhookSender
from dbqueue.runtime.tenants import TenantDatabases, TenantSource
from dbqueue.schema.tables import (
    DEFAULT_QUEUE,
    TableNames,
    tables_for,
    workers_table,
)
from dbqueue.tasks.registry import TaskRegistry
from dbqueue.tasks.retry import (
    DEFAULT_BACKOFF,
    DEFAULT_MAX_ATTEMPTS,
    Backoff,
    RetryPolicy,
    linear_backoff,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from dbqueue.strategies import ClaimStrategy


class RuntimeContext:
    """One queue's resolved configuration and shared run-time objects.

    ``engine``: the user's own Engine, when the App was given one. ``registry`` and
    ``local_workers`` and ``instruments`` are shared by every context ``reconfigured`` from this
    one: the handlers registered on the App, the workers of this process that an enqueue wakes,
    and the metrics and tracing observers.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        engine: Engine | None = None,
        backoff: Backoff | None = None,
        registry: TaskRegistry | None = None,
        environ: Mapping[str, str] | None = None,
        local_workers: LocalWorkers | None = None,
        instruments: Instruments | None = None,
        tenant_databases: TenantSource | None = None,
        tenants: TenantDatabases | None = None,
    ) -> None:
        self.settings = settings
        #: Metrics and tracing observers, shared by every context reconfigured from this one.
        self.instruments = instruments if instruments is not None else Instruments()
        self.names = TableNames.resolve(
            settings.table_prefix,
            settings.schema,
            settings.jobs_table,
            settings.subscriptions_table,
        )
        self.tables = tables_for(self.names)
        self._resolve_job_defaults(settings, backoff)
        self.registry = registry if registry is not None else TaskRegistry()
        if settings.transaction is not None:
            self.registry.default_transaction = settings.transaction
        self.retry_policy = RetryPolicy(self.registry, self.backoff)
        self.subscriptions = SubscriptionStore(self.tables)
        timeout = settings.webhook_timeout
        self.webhook_sender = WebhookSender(DEFAULT_WEBHOOK_TIMEOUT if timeout is None else timeout)
        #: Runs deliveries no code is registered for: calls to the subscription's url.
        self.webhooks = WebhookHandler(self.subscriptions, self.webhook_sender)
        self.maintenance_settings = MaintenanceSettings.from_settings(settings)
        #: Workers running in this process: a local enqueue wakes them when it commits, a
        #: retry scheduled here tells them when it falls due.
        self.local_workers = local_workers if local_workers is not None else LocalWorkers()
        #: The tenants' databases (``App(tenant_databases=…)`` / MULTI_DATABASE), or None.
        self.tenants = (
            tenants
            if tenants is not None
            else TenantDatabases.configure(tenant_databases, settings)
        )
        self._environ = environ
        self._engine = engine
        self._lock = threading.Lock()
        self._queue_engines: dict[int, QueueEngine] = {}
        self._async_engines: weakref.WeakKeyDictionary[Any, AsyncEngine] = (
            weakref.WeakKeyDictionary()
        )
        self._cancel_requests: RequestStore | None = None
        self._workers_engine: Engine | bool | None = None

    def _resolve_job_defaults(self, settings: Settings, backoff: Backoff | None) -> None:
        """What a job gets when its enqueue or task says nothing: its queue, its attempts, its
        retries' spacing and its payload's size limit (checked here, once)."""
        self.default_queue = check_queue_name(settings.queue or DEFAULT_QUEUE)
        self.max_attempts = settings.max_attempts or DEFAULT_MAX_ATTEMPTS
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts={self.max_attempts} must be at least 1")
        self._explicit_backoff = backoff
        # A base interval (App(retry_base_interval=…), the seed's variables) is the seed's
        # linear rule; without one, the polynomial backoff with jitter.
        base_interval = settings.retry_base_interval
        self.backoff: Backoff = backoff or (
            DEFAULT_BACKOFF if base_interval is None else linear_backoff(base_interval)
        )
        self.max_payload_bytes = (
            payload_codec.DEFAULT_MAX_PAYLOAD_BYTES
            if settings.max_payload_bytes is None
            else settings.max_payload_bytes
        )

    def reconfigured(self, **overrides: Any) -> RuntimeContext:
        """A context whose settings have these overrides (None: unchanged), sharing this one's
        registry, local workers and, while the database stays the same, its engine."""
        settings = self.settings.merged(**overrides)
        same_database = settings.url == self.settings.url and settings.dialect == (
            self.settings.dialect
        )
        return RuntimeContext(
            settings,
            engine=self._engine if same_database else None,
            backoff=None if overrides.get("retry_base_interval") else self._explicit_backoff,
            registry=self.registry,
            environ=self._environ,
            local_workers=self.local_workers,
            instruments=self.instruments,
            tenants=self.tenants,
        )

    # ---- the database -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self._engine is not None:
            return self._engine.url.render_as_string(hide_password=False)
        return dialects.resolve_url(self.settings.url, self.settings.dialect, self._environ)

    @property
    def engine(self) -> Engine:
        """The queue's own engine (created on first use when it was given a URL)."""
        with self._lock:
            if self._engine is None:
                self._engine = self.create_engine()
            return self._engine

    def create_engine(self, **kwargs: Any) -> Engine:
        """A new engine on the queue's database, configured the way dbqueue needs it."""
        return dialects.create_engine(self.url, **kwargs)

    @property
    def has_async_driver(self) -> bool:
        """Whether this database has an asyncio driver (else aenqueue runs the sync path in a
        thread)."""
        return bool(self.settings.async_url) or self.dialect_class().async_driver is not None

    def async_engine(self) -> AsyncEngine:
        """dbqueue's own asyncio engine for the running event loop: an asyncio connection
        belongs to the loop that opened it, so each loop gets a pool of its own."""
        loop = asyncio.get_running_loop()
        with self._lock:
            found = self._async_engines.get(loop)
            if found is None:
                found = self._async_engines[loop] = self.create_async_engine()
            return found

    def forget_async_engine(self) -> AsyncEngine | None:
        """Stop using the running loop's asyncio engine; returns it (to dispose), if any."""
        with self._lock:
            return self._async_engines.pop(asyncio.get_running_loop(), None)

    def create_async_engine(self, **kwargs: Any) -> AsyncEngine:
        """A new asyncio engine on the queue's database (``async_url``, else ``url`` with the
        database's asyncio driver), configured the way dbqueue needs it."""
        return dialects.create_async_engine(self.settings.async_url or self.url, **kwargs)

    def dialect_class(self) -> type[dialects.Dialect]:
        """The database's module, known without connecting."""
        if self._engine is not None:
            return dialects.class_for_sqlalchemy_name(self._engine.dialect.name)
        return dialects.class_for_url(sa.engine.make_url(self.url))

    def queue_engine(self, conn: Connection) -> QueueEngine:
        """The lifecycle engine for this queue's tables on ``conn``'s database."""
        key = id(conn.dialect)
        found = self._queue_engines.get(key)
        if found is None or found.dialect.sa_dialect is not conn.dialect:
            found = QueueEngine(
                self.tables, dialects.for_sqlalchemy(conn.dialect), self.instruments
            )
            self._queue_engines[key] = found
        return found

    def cancel_requests(self) -> RequestStore:
        """Where cancel requests for running jobs are kept (``dbqueue.runtime.cancellation``)."""
        with self._lock:
            if self._cancel_requests is None:
                side = self.dialect_class().side_database_url(sa.engine.make_url(self.url))
                self._cancel_requests = request_store(side, self.tables)
            return self._cancel_requests

    def workers_side_engine(self) -> Engine | None:
        """Where the registry of live workers is kept when not beside the jobs: the database's
        side file (SQLite), as a batch holds the database's one write lock for as long as its
        handlers run and a heartbeat must not wait for it. None: the queue's own database."""
        with self._lock:
            if self._workers_engine is None:
                side = self.dialect_class().side_database_url(sa.engine.make_url(self.url))
                self._workers_engine = False
                if side is not None:
                    names = dataclasses.replace(self.names, schema=None)
                    table = workers_table(sa.MetaData(), names)
                    engine = dialects.create_engine(side, pool_size=1, max_overflow=4)
                    with engine.begin() as conn:
                        conn.execute(sa.schema.CreateTable(table, if_not_exists=True))
                    self._workers_engine = engine
            return self._workers_engine or None

    @contextlib.contextmanager
    def workers_connection(self, conn: Connection) -> Iterator[Connection]:
        """A connection to the registry of live workers: ``conn`` itself, or one to the side
        database (in a transaction of its own) where the registry is kept there."""
        side = self.workers_side_engine()
        if side is None:
            yield conn
            return
        self.queue_engine(conn).workers.check_workers_table(
            conn
        )  # unmigrated: say so, as elsewhere
        with side.begin() as own:
            yield own

    def check_database(self, engine: Engine) -> dialects.Dialect:
        """Start-up checks: the server answers, suits dbqueue, and has the tables at the
        current migration. One line naming the fix when not."""
        from dbqueue.migrations.migrate import check_schema  # Alembic: loaded when first used

        try:
            with engine.connect() as conn:
                dialect = dialects.for_sqlalchemy(conn.dialect)
                dialect.check_connection(conn)
                check_schema(conn, self.names)
        except sa.exc.DBAPIError as exc:
            orig = exc.orig
            first = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
            raise DatabaseUnavailableError(
                f"cannot connect to {redact(self.url)}: {first} "
                "(check --url / DBQUEUE_URL, that the server is running, and the credentials)"
            ) from None
        return dialect

    # ---- the claim strategy -------------------------------------------------------------------
    def strategy_class(self, dialect: type[dialects.Dialect] | None = None) -> type[ClaimStrategy]:
        """The configured strategy (--strategy / DBQUEUE_STRATEGY / CLIENT_SERVER_MODE), else
        the database's default: the one place a strategy is chosen."""
        dialect = dialect or self.dialect_class()
        return strategies.resolve(self.settings.strategy, dialect)

    def open_strategy(self, dialect: dialects.Dialect) -> ClaimStrategy:
        """The strategy, checked against the server (``dialect`` is a connected one)."""
        return self.strategy_class(type(dialect))(dialect, self.settings)

    def notifier(self, strategy: ClaimStrategy, engine: Engine) -> Notifier:
        """Where wake-ups come from: the strategy's own channel (the lock server), else the
        database's (PostgreSQL's NOTIFY), else polling."""
        return strategy.notifier(engine, self.names) or strategy.dialect.notifier(
            engine, self.names.qualified_jobs
        )

    def hints_lock_server(self) -> bool:
        """Whether enqueues tell a lock server that work is available: a lock server is set,
        or the strategy claims through one (the default on SingleStore)."""
        if self.settings.lock_server:
            return True
        try:
            return self.strategy_class().claims_through_lock_server
        except ConfigurationError:
            return False

"""``dbqueue.App``: the facade users call — registration, enqueue, publish, subscriptions,
queries and maintenance — over a runtime context that holds the configuration and does the work
below it (the worker, maintenance, migrations and the lock server use that context directly)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine
from typing_extensions import Unpack

from dbqueue.app.aio import AsyncClient
from dbqueue.app.calls import ResultCalls
from dbqueue.app.cancel import CancelAPI
from dbqueue.app.eager import EagerMode, check_flag
from dbqueue.app.monitoring import (
    QueueSummary,
    WorkerInfo,
    stats_report,
    with_running,
    worker_infos,
)
from dbqueue.app.morgue import MorgueAPI
from dbqueue.app.periodic import PeriodicRegistration
from dbqueue.app.queues import QueueConfiguration
from dbqueue.app.registration import HandlerRegistration
from dbqueue.base import payload as payload_codec
from dbqueue.config import Settings
from dbqueue.errors import ConfigurationError
from dbqueue.job import Status
from dbqueue.migrations import migrate
from dbqueue.pubsub.subscriptions import Subscription, SubscriptionChanges, new_subscription_values
from dbqueue.runtime import maintenance
from dbqueue.runtime.commit_wake import CommitWaker
from dbqueue.runtime.context import RuntimeContext
from dbqueue.runtime.enqueue import EnqueueOptions
from dbqueue.runtime.targets import Target, connection_for, write_target
from dbqueue.runtime.tenants import TenantSource
from dbqueue.schema.tables import DEFAULT_HTTP_METHOD
from dbqueue.tasks.retry import Backoff
from dbqueue.worker.runner import Worker, WorkerSummary

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from dbqueue.config import MaintenanceSettings
    from dbqueue.pubsub.subscriptions import SubscriptionStore
    from dbqueue.pubsub.webhooks import WebhookSender
    from dbqueue.schema.tables import QueueTables, TableNames
    from dbqueue.tasks.registry import TaskRegistry

_ANY: Any = object()  # "do not filter on this column"


def _from_context(name: str, doc: str) -> Any:
    return property(lambda app: getattr(app.context, name), doc=doc)


class App(
    EagerMode,
    AsyncClient,
    HandlerRegistration,
    CancelAPI,
    MorgueAPI,
    PeriodicRegistration,
    QueueConfiguration,
    ResultCalls,
):
    """A queue: where its tables live, which tasks it knows, and how to enqueue and consume.

    ``App("postgresql+psycopg2://…")`` or ``App(engine)``; with no argument the URL comes from
    DBQUEUE_URL, else the seed's DB_*/DATABASE_* variables, else ``sqlite:///dbqueue.db``.
    Creating an App never connects; the first enqueue or worker does. ``async_url`` (default
    $DBQUEUE_ASYNC_URL, else the URL with the database's asyncio driver) is where the async
    calls (``aenqueue`` …) open transactions of their own. ``lock_server``
    ("HOST:PORT", default $DBQUEUE_LOCK_SERVER) is where the lock_server strategy takes its
    locks and where enqueues hint that work is available. ``tenant_databases`` (a mapping
    tenant → URL, a URL template with ``{tenant}``, or a callable tenant → URL or Engine;
    default: the seed's credentials API when MULTI_DATABASE=true) is where handlers registered
    with ``tenant_database=True`` find the job's tenant's database; ``tenant_cache_size``
    (default $DBQUEUE_TENANT_CACHE_SIZE, else 20) how many tenants' engines stay open.
    """

    def __init__(
        self,
        url: str | Engine | None = None,
        *,
        async_url: str | None = None,
        dialect: str | None = None,
        table_prefix: str | None = None,
        schema: str | None = None,
        jobs_table: str | None = None,
        subscriptions_table: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        retry_base_interval: float | None = None,
        backoff: Backoff | None = None,
        max_payload_bytes: int | None = None,
        lock_server: str | None = None,
        webhook_timeout: float | None = None,
        eager: bool | None = None,
        eager_raise: bool | None = None,
        tenant_databases: TenantSource | None = None,
        tenant_cache_size: int | None = None,
        settings: Settings | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if url is not None and not isinstance(url, (str, Engine)):
            raise ConfigurationError(
                f"App() takes a database URL or a SQLAlchemy Engine, not {type(url).__name__}"
            )
        base = settings if settings is not None else Settings.from_env(environ)
        merged = base.merged(
            url=url if isinstance(url, str) else None,
            async_url=async_url,
            dialect=dialect,
            table_prefix=table_prefix,
            schema=schema,
            jobs_table=jobs_table,
            subscriptions_table=subscriptions_table,
            queue=queue,
            max_attempts=max_attempts,
            retry_base_interval=retry_base_interval,
            max_payload_bytes=max_payload_bytes,
            lock_server=lock_server,
            notify_server=lock_server,
            webhook_timeout=webhook_timeout,
            eager=check_flag("eager", eager),
            eager_raise=check_flag("eager_raise", eager_raise),
            tenant_cache_size=tenant_cache_size,
        )
        engine = url if isinstance(url, Engine) else None
        self._use(
            RuntimeContext(
                merged,
                engine=engine,
                backoff=backoff,
                environ=environ,
                tenant_databases=tenant_databases,
            )
        )

    def _use(self, context: RuntimeContext) -> None:
        self.context = context
        self._waker = CommitWaker(context)

    def reconfigured(self, **overrides: Any) -> App:
        """A copy of this App with these settings changed (None: unchanged): the same
        registered handlers, everything derived from the settings derived anew."""
        clone = App.__new__(App)
        clone._use(self.context.reconfigured(**overrides))
        return clone

    # Read-only properties; annotated so that type checkers see what they return.
    settings: Settings = _from_context("settings", "The resolved settings (frozen).")
    names: TableNames = _from_context("names", "The queue's table names.")
    tables: QueueTables = _from_context("tables", "The queue's SQLAlchemy tables.")
    registry: TaskRegistry = _from_context("registry", "Task names and subscribers → handlers.")
    default_queue: str = _from_context("default_queue", "Where jobs go without a queue.")
    max_attempts: int = _from_context("max_attempts", "Attempts a job gets without its own.")
    backoff: Backoff = _from_context("backoff", "Seconds before a retry, by attempt, by default.")
    max_payload_bytes: int = _from_context("max_payload_bytes", "Largest payload accepted.")
    url: str = _from_context("url", "The database URL (password included: redact it to show).")
    engine: Engine = _from_context("engine", "The App's own engine (created on first use).")
    maintenance_settings: MaintenanceSettings = _from_context(
        "maintenance_settings", "Schedules and retention."
    )
    subscription_store: SubscriptionStore = _from_context(
        "subscriptions", "The subscriptions table's queries."
    )
    webhook_sender: WebhookSender = _from_context(
        "webhook_sender", "How webhook deliveries are sent."
    )

    def create_engine(self, **kwargs: Any) -> Engine:
        """A new engine on the App's database, configured the way dbqueue needs it."""
        return self.context.create_engine(**kwargs)

    def create_async_engine(self, **kwargs: Any) -> AsyncEngine:
        """A new asyncio engine on the App's database (``async_url``, else the URL with the
        database's asyncio driver: postgresql+asyncpg, mysql+aiomysql, sqlite+aiosqlite)."""
        return self.context.create_async_engine(**kwargs)

    @property
    def async_engine(self) -> AsyncEngine:
        """The asyncio engine ``aenqueue(None, …)`` uses in the running event loop (one per
        loop: an asyncio connection belongs to the loop that opened it)."""
        return self.context.async_engine()

    def queue_engine(self, conn: Any) -> Any:
        """The lifecycle engine for this App's tables on ``conn``'s database."""
        return self.context.queue_engine(conn)

    # ---- client API ---------------------------------------------------------------------------
    def enqueue(
        self,
        target: Target | None,
        task: str,
        payload: Any = None,
        **options: Unpack[EnqueueOptions],
    ) -> int:
        """Insert one job in ``target``'s transaction and return its id.

        ``target`` is an ORM Session or a Connection (the job commits or rolls back with the
        caller's work) or an Engine/None (dbqueue commits at once). Lower priority runs first.
        The options (``EnqueueOptions``): queue, priority, delay, run_at, max_attempts,
        external_key, origin, destination, tenant, business_group, unique_key, on_conflict.
        With a ``unique_key`` the id returned is that of the job carrying this enqueue, which
        may be one enqueued before (see the README's "Unique jobs").
        """
        return self._write(target, self._enqueue_write("enqueue", task, payload, options))

    def enqueue_many(self, target: Target | None, jobs: Iterable[Mapping[str, Any]]) -> list[int]:
        """Insert many jobs with multi-row statements (see the README); each item is a dict of
        ``enqueue``'s arguments (``task`` required, ``payload`` and the options optional). All
        are validated first."""
        return self._write(target, self._enqueue_many_write("enqueue_many", jobs))

    def publish(
        self,
        target: Target | None,
        topic: str,
        payload: Any = None,
        **options: Unpack[EnqueueOptions],
    ) -> int:
        """Publish ``payload`` on ``topic`` in ``target``'s transaction; return the
        publication id.

        Every active subscription of the topic whose tenant and business group filters match
        (a filter left empty matches everything) gets its own job — a delivery with its own
        status, attempts and retries. The publication itself is recorded as a finished row
        (id = the publication id) whose message lists the subscriptions reached, or says that
        none matched. ``queue``, ``priority`` and ``max_attempts`` apply to every delivery,
        else each subscriber's registered options, else the App's defaults.
        """
        return self._publish(target, topic, payload, options, webhooks_only=False)

    def publish_webhook(
        self,
        target: Target | None,
        topic: str,
        payload: Any = None,
        **options: Unpack[EnqueueOptions],
    ) -> int:
        """Like ``publish``, but only subscriptions with a webhook url receive it (the seed's
        ``insert_task_webhook``)."""
        return self._publish(target, topic, payload, options, webhooks_only=True)

    def _publish(
        self,
        target: Target | None,
        topic: str,
        payload: Any,
        options: Mapping[str, Any],
        webhooks_only: bool,
    ) -> int:
        call = "publish_webhook" if webhooks_only else "publish"
        write = self._publish_write(call, topic, payload, options, webhooks_only)
        return self._write(target, write)

    # ---- subscriptions ------------------------------------------------------------------------
    def add_subscription(
        self,
        target: Target | None,
        subscription_id: str,
        topic: str,
        *,
        tenant: int | None = None,
        business_group: str | None = None,
        url: str | None = None,
        method: str = DEFAULT_HTTP_METHOD,
        headers: Mapping[str, Any] | None = None,
        active: bool = True,
    ) -> Subscription:
        """Subscribe ``subscription_id`` to ``topic`` (a row of the subscriptions table).

        With a ``url`` its deliveries are webhook calls (``method`` GET, POST or PUT, with
        ``headers``) unless code is registered for it; without, ``@app.subscriber`` code runs
        them. ``tenant`` / ``business_group`` restrict it to publications for those.
        """
        values = new_subscription_values(
            subscription_id,
            topic,
            tenant=tenant,
            business_group=business_group,
            url=url,
            method=method,
            headers=headers,
            active=active,
        )
        with connection_for(write_target(self._target(target))) as conn:
            return self.context.subscriptions.add(conn, values)

    def subscriptions(
        self, topic: str | None = None, *, active: bool | None = None, target: Target | None = None
    ) -> list[Subscription]:
        """The subscriptions (of one topic; only the active or inactive ones), by topic and id."""
        with connection_for(self._target(target)) as conn:
            return self.context.subscriptions.find(conn, topic, active)

    def get_subscription(
        self, subscription_id: str, target: Target | None = None
    ) -> Subscription | None:
        with connection_for(self._target(target)) as conn:
            return self.context.subscriptions.get(conn, subscription_id)

    def enable_subscription(self, target: Target | None, subscription_id: str) -> Subscription:
        """Let the subscription receive publications again (a disabled one receives none, and
        its pending webhook deliveries wait, failing their attempts, until it is enabled)."""
        with connection_for(write_target(self._target(target))) as conn:
            return self.context.subscriptions.set_active(conn, subscription_id, True)

    def disable_subscription(self, target: Target | None, subscription_id: str) -> Subscription:
        """Stop the subscription receiving publications (it stays in the table)."""
        with connection_for(write_target(self._target(target))) as conn:
            return self.context.subscriptions.set_active(conn, subscription_id, False)

    def update_subscription(
        self, target: Target | None, subscription_id: str, **changes: Unpack[SubscriptionChanges]
    ) -> Subscription:
        """Change a subscription's topic, filters, webhook (url, method, headers) or active
        flag; None clears tenant, business_group, url and headers. Returns the new row."""
        with connection_for(write_target(self._target(target))) as conn:
            return self.context.subscriptions.update(conn, subscription_id, changes)

    def remove_subscription(self, target: Target | None, subscription_id: str) -> Subscription:
        """Delete a subscription; returns the row it was. Its pending deliveries stay: a
        webhook's fail their attempts (retried in case it is added back), code still runs."""
        with connection_for(write_target(self._target(target))) as conn:
            return self.context.subscriptions.remove(conn, subscription_id)

    def find_equivalent(
        self,
        target: Target | None,
        task: str,
        payload: Any,
        *,
        statuses: Sequence[str] = Status.PENDING,
        queue: str | None = _ANY,
        external_key: str | None = _ANY,
        origin: str | None = _ANY,
        destination: str | None = _ANY,
        tenant: int | None = _ANY,
        business_group: str | None = _ANY,
    ) -> list[dict[str, Any]]:
        """Jobs of ``task`` with the same payload (by hash) in one of ``statuses`` (default:
        waiting or running) — to avoid enqueueing the same work twice. Keyword filters narrow
        the match; pass None to require the column to be empty."""
        encoded = payload_codec.encode(payload, max_bytes=None)
        filters = {
            column: value
            for column, value in (
                ("queue", queue),
                ("external_key", external_key),
                ("origin", origin),
                ("destination", destination),
                ("tenant", tenant),
                ("business_group", business_group),
            )
            if value is not _ANY
        }
        with connection_for(self._target(target)) as conn:
            return self.context.queue_engine(conn).queries.find_equivalent(
                conn, task, encoded, statuses, filters
            )

    def get_job(self, job_id: int, target: Target | None = None) -> dict[str, Any] | None:
        """One job row as a dict (None if there is no such job)."""
        with connection_for(self._target(target)) as conn:
            return self.context.queue_engine(conn).queries.get(conn, job_id)

    # ---- monitoring (the dead-job morgue: dbqueue.morgue) ------------------------------------
    def stats(self, target: Target | None = None) -> list[QueueSummary]:
        """Per queue: ``counts`` (the statuses its rows hold), ``by_status`` (every status,
        zeros included; scheduled apart from available; ``running`` includes the jobs live
        workers report running, under every strategy), the oldest runnable job's age."""
        with connection_for(self._target(target)) as conn:
            engine = self.context.queue_engine(conn)
            found = engine.queries.stats(conn)[0]
            with self.context.workers_connection(conn) as registry:
                infos = worker_infos(self.context.queue_engine(registry), registry)
            return with_running(engine, conn, found, infos)

    def workers(
        self, *, include_gone: bool = False, target: Target | None = None
    ) -> list[WorkerInfo]:
        """The worker processes in the registry of live workers, oldest first; with
        ``include_gone`` also those whose heartbeat expired (``alive`` False) that maintenance
        has not deleted yet."""
        with (
            connection_for(self._target(target)) as conn,
            self.context.workers_connection(conn) as registry,
        ):
            return worker_infos(self.context.queue_engine(registry), registry, include_gone)

    def stats_report(self, target: Target | None = None) -> dict[str, Any]:
        """What ``/api/v1/stats`` and ``dbqueue stats --json`` return, in Lowkiq's shape:
        ``{"total": {...}, "by_queue": {queue: {...}}}``, each with ``length`` (waiting jobs),
        ``morgue_length`` (dead jobs), ``lag`` (seconds) and ``counts`` (every status)."""
        return stats_report(self.stats(target))

    # ---- maintenance --------------------------------------------------------------------------
    def run_maintenance(self, routine: str, *, strategy: str | None = None) -> str:
        """Run one maintenance routine now (``purge``, ``rescue`` or ``renotify``), as the
        workers' leader would, recording it; returns what it did. ``strategy`` decides which
        locks tell a live worker from a dead one (default: the database's strategy)."""
        return maintenance.run_once(self.context.reconfigured(strategy=strategy), routine)

    def maintenance_status(self, target: Target | None = None) -> list[dict[str, Any]]:
        """One row per routine: last tick, who ran it, when, how many runs, the result."""
        with connection_for(self._target(target)) as conn:
            return self.context.queue_engine(conn).housekeeping.maintenance_status(conn)

    # ---- schema -------------------------------------------------------------------------------
    def migrate(self, revision: str = "head") -> None:
        """Create or upgrade the queue tables (the same migrations as ``dbqueue migrate``)."""
        migrate.upgrade(self.engine, self.names, revision)

    # ---- workers ------------------------------------------------------------------------------
    def worker(self, **options: Any) -> Worker:
        """A Worker for this App; see ``dbqueue.Worker`` for the options."""
        return Worker(self, **options)

    def run_worker(self, **options: Any) -> WorkerSummary:
        """Run a worker in this thread until it stops (signal, --burst, or a limit)."""
        return self.worker(**options).run()

    def _target(self, target: Target | None) -> Target:
        return self.context.engine if target is None else target

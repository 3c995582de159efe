"""``dbqueue.App``: the facade users call — registration, enqueue, publish, subscriptions,
queries and maintenance — over a runtime context that holds the configuration and does the work
below it (the worker, maintenance, migrations and the lock server use that context directly).

Every public name of the App is here, each handing the call to one of the parts the App builds
on its context (``_use``); their methods carry the detailed documentation."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine
from typing_extensions import Unpack

from dbqueue.app.aio import AsyncTarget, AsyncWrites
from dbqueue.app.calls import FinishWaiters, ResultCalls
from dbqueue.app.eager import AfterCommit, check_flag
from dbqueue.app.jobs import UNFILTERED, JobLookup
from dbqueue.app.maintenance import MaintenanceCalls
from dbqueue.app.monitoring import Monitoring, QueueSummary, WorkerInfo
from dbqueue.app.morgue import MorgueCalls
from dbqueue.app.periodic import PeriodicSchedules, ScheduleOptions
from dbqueue.app.queues import QueueDeclarations
from dbqueue.app.registration import H, HandlerOptions, HandlerRegistration, M
from dbqueue.app.subscriptions import SubscriptionCalls
from dbqueue.app.writes import ClientWrites
from dbqueue.config import Settings
from dbqueue.errors import ConfigurationError
from dbqueue.job import Status
from dbqueue.pubsub.subscriptions import Subscription, SubscriptionChanges
from dbqueue.runtime.cancellation import Cancellation
from dbqueue.runtime.commit_wake import CommitWaker
from dbqueue.runtime.context import RuntimeContext
from dbqueue.runtime.enqueue import EnqueueOptions
from dbqueue.runtime.periodic import TickOutcome
from dbqueue.runtime.targets import Target
from dbqueue.runtime.tenants import TenantSource
from dbqueue.schema.tables import DEFAULT_HTTP_METHOD
from dbqueue.tasks.retry import Backoff
from dbqueue.tasks.schedules import Schedule
from dbqueue.worker.runner import Worker, WorkerSummary

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from dbqueue.config import MaintenanceSettings
    from dbqueue.pubsub.subscriptions import SubscriptionStore
    from dbqueue.pubsub.webhooks import WebhookSender
    from dbqueue.schema.tables import QueueTables, TableNames
    from dbqueue.tasks.registry import TaskRegistry


def _from_context(name: str, doc: str) -> Any:
    return property(lambda app: getattr(app.context, name), doc=doc)


class App:
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

    # Signatures that ruff would spread one parameter a line are packed by hand (fmt: skip), so
    # that the whole surface reads in this one class.
    def __init__(self, url: str | Engine | None = None, *, async_url: str | None = None,
                 dialect: str | None = None, table_prefix: str | None = None,
                 schema: str | None = None, jobs_table: str | None = None,
                 subscriptions_table: str | None = None, queue: str | None = None,
                 max_attempts: int | None = None, retry_base_interval: float | None = None,
                 backoff: Backoff | None = None, max_payload_bytes: int | None = None,
                 lock_server: str | None = None, webhook_timeout: float | None = None,
                 eager: bool | None = None, eager_raise: bool | None = None,
                 tenant_databases: TenantSource | None = None,
                 tenant_cache_size: int | None = None, settings: Settings | None = None,
                 environ: Mapping[str, str] | None = None,
                 transaction: bool | None = None) -> None:  # fmt: skip
        if url is not None and not isinstance(url, (str, Engine)):
            raise ConfigurationError(
                f"App() takes a database URL or a SQLAlchemy Engine, not {type(url).__name__}"
            )
        base = settings if settings is not None else Settings.from_env(environ)
        merged = base.merged(
            url=url if isinstance(url, str) else None, async_url=async_url, dialect=dialect,
            table_prefix=table_prefix, schema=schema, jobs_table=jobs_table,
            subscriptions_table=subscriptions_table, queue=queue, max_attempts=max_attempts,
            retry_base_interval=retry_base_interval, max_payload_bytes=max_payload_bytes,
            lock_server=lock_server, notify_server=lock_server, webhook_timeout=webhook_timeout,
            eager=check_flag("eager", eager), eager_raise=check_flag("eager_raise", eager_raise),
            tenant_cache_size=tenant_cache_size, transaction=transaction,
        )  # fmt: skip
        engine = url if isinstance(url, Engine) else None
        context = RuntimeContext(
            merged,
            engine=engine,
            backoff=backoff,
            environ=environ,
            tenant_databases=tenant_databases,
        )
        self._use(context)

    def _use(self, context: RuntimeContext) -> None:
        """Build the parts on ``context``, each given the others it calls."""
        self.context = context
        waker = CommitWaker(context)
        after_commit = AfterCommit(context, waker)  # wakes workers, or runs jobs (eager)
        self._after_commit = after_commit
        self._registration = HandlerRegistration(context)
        self._queues = QueueDeclarations(context)
        self._periodic = PeriodicSchedules(context, after_commit)
        self._writes = ClientWrites(context, after_commit)
        self._async_writes = AsyncWrites(context, self._writes, after_commit)
        self._results = ResultCalls(context, FinishWaiters(context, waker), after_commit)
        self._cancellation = Cancellation(context)
        self._subscriptions = SubscriptionCalls(context)
        self._jobs = JobLookup(context)
        self._morgue = MorgueCalls(context, waker)
        self._monitoring = Monitoring(context)
        self._maintenance = MaintenanceCalls(context)

    def reconfigured(self, **overrides: Any) -> App:
        """A copy of this App with these settings changed (None: unchanged): the same
        registered handlers, everything derived from the settings derived anew."""
        clone = App.__new__(App)
        clone._use(self.context.reconfigured(**overrides))
        return clone

    # ---- configuration (read-only; annotated so that type checkers see what they return) -----
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

    @property
    def eager(self) -> bool:
        """Whether jobs run in this process when their enqueue commits (eager mode)."""
        return self._after_commit.eager

    # ---- engines ------------------------------------------------------------------------------
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

    # ---- handlers, queues and schedules -------------------------------------------------------
    def task(self, name: str | None = None, *, timeout: float | None = None,
             **options: Unpack[HandlerOptions]) -> Callable[[H], H]:  # fmt: skip
        """Register ``handler(job, session)`` for a task name (default: the function's name)."""
        return self._registration.task(name, timeout=timeout, **options)

    def batch_task(self, name: str | None = None, *, max_size: int = 100, max_wait: float = 1.0,
                   timeout: float | None = None,
                   **options: Unpack[HandlerOptions]) -> Callable[[H], H]:  # fmt: skip
        """Register ``handler(jobs, session)`` for a task whose jobs run in batches."""
        return self._registration.batch_task(
            name, max_size=max_size, max_wait=max_wait, timeout=timeout, **options
        )

    def middleware(self, fn: M) -> M:
        """Run ``fn(job, call_next)`` around every handler (the first registered outermost)."""
        return self._registration.middleware(fn)

    def on_worker_start(self, fn: M) -> M:
        """Run ``fn(worker)`` in each worker once it is set up, before it claims anything."""
        return self._registration.on_worker_start(fn)

    def on_worker_stop(self, fn: M) -> M:
        """Run ``fn(worker)`` when a worker that started stops, after its last job."""
        return self._registration.on_worker_stop(fn)

    def on_worker_error(self, fn: M) -> M:
        """Run ``fn(exc, worker)`` for an error that escaped every handler."""
        return self._registration.on_worker_error(fn)

    def dead_handler(self, task: str, *, tenant_database: bool = False) -> Callable[[H], H]:
        """Register ``handler(job, session)`` to run on a task's dead-letter jobs."""
        return self._registration.dead_handler(task, tenant_database=tenant_database)

    def subscriber(
        self, topic: str, subscription_id: str, **options: Unpack[HandlerOptions]
    ) -> Callable[[H], H]:
        """Register ``handler(job, session)`` for the deliveries of one subscription of a topic."""
        return self._registration.subscriber(topic, subscription_id, **options)

    def dead_subscriber(
        self, topic: str, subscription_id: str, *, tenant_database: bool = False
    ) -> Callable[[H], H]:
        """Register ``handler(job, session)`` for a subscription's dead deliveries."""
        return self._registration.dead_subscriber(
            topic, subscription_id, tenant_database=tenant_database
        )

    def queue(self, name: str, *, concurrency: int | None = None) -> str:
        """Declare queue ``name`` (``concurrency=N``: at most N of its jobs run at once)."""
        return self._queues.queue(name, concurrency=concurrency)

    @property
    def queue_limits(self) -> dict[str, int]:
        """The declared limits, queue → N (a copy)."""
        return self._queues.queue_limits

    def periodic(self, cron: str | None = None, *, name: str | None = None,
                 every: float | dt.timedelta | None = None, payload: Any = None,
                 tz: str | dt.tzinfo | None = None, catch_up: str = "none",
                 **options: Unpack[ScheduleOptions]) -> Callable[[H], H]:  # fmt: skip
        """Enqueue the decorated task on a schedule: ``cron`` or ``every`` seconds."""
        return self._periodic.periodic(cron, name, every, payload, tz, catch_up, options)

    def schedule(self, cron: str | None = None, *, task: str, name: str | None = None,
                 every: float | dt.timedelta | None = None, payload: Any = None,
                 tz: str | dt.tzinfo | None = None, catch_up: str = "none",
                 **options: Unpack[ScheduleOptions]) -> Schedule:  # fmt: skip
        """Enqueue ``task`` on a schedule (``periodic``'s arguments); returns the schedule."""
        return self._periodic.schedule(cron, task, name, every, payload, tz, catch_up, options)

    def schedules(self) -> list[Schedule]:
        """Every schedule declared on this App, by name (each with its task resolved)."""
        return self._periodic.schedules()

    def enqueue_periodic(self, now: dt.datetime | None = None) -> list[TickOutcome]:
        """Enqueue the ticks due at ``now`` (default: now), as each worker's scheduler does."""
        return self._periodic.enqueue_periodic(now)

    def periodic_status(self) -> list[dict[str, Any]]:
        """One dict per schedule (declared, or only in the table): its rule and last ticks."""
        return self._periodic.periodic_status()

    # ---- creating jobs ------------------------------------------------------------------------
    def enqueue(self, target: Target | None, task: str, payload: Any = None,
                **options: Unpack[EnqueueOptions]) -> int:  # fmt: skip
        """Insert one job in ``target``'s transaction and return its id."""
        return self._writes.enqueue(target, task, payload, options)

    def enqueue_many(self, target: Target | None, jobs: Iterable[Mapping[str, Any]]) -> list[int]:
        """Insert many jobs (dicts of ``enqueue``'s arguments), all validated first."""
        return self._writes.enqueue_many(target, jobs)

    def publish(self, target: Target | None, topic: str, payload: Any = None,
                **options: Unpack[EnqueueOptions]) -> int:  # fmt: skip
        """Publish ``payload`` on ``topic`` in ``target``'s transaction; return its id."""
        return self._writes.publish(target, topic, payload, options)

    def publish_webhook(self, target: Target | None, topic: str, payload: Any = None,
                        **options: Unpack[EnqueueOptions]) -> int:  # fmt: skip
        """Like ``publish``, but only subscriptions with a webhook url receive it."""
        return self._writes.publish_webhook(target, topic, payload, options)

    async def aenqueue(
        self, target: AsyncTarget, task: str, payload: Any = None, **options: Unpack[EnqueueOptions]
    ) -> int:
        """``enqueue`` for asyncio (an AsyncSession, AsyncConnection or None)."""
        return await self._async_writes.aenqueue(target, task, payload, options)

    async def aenqueue_many(
        self, target: AsyncTarget, jobs: Iterable[Mapping[str, Any]]
    ) -> list[int]:
        """``enqueue_many`` for asyncio."""
        return await self._async_writes.aenqueue_many(target, jobs)

    async def apublish(self, target: AsyncTarget, topic: str, payload: Any = None,
                       **options: Unpack[EnqueueOptions]) -> int:  # fmt: skip
        """``publish`` for asyncio; returns the publication id."""
        return await self._async_writes.apublish(target, topic, payload, options)

    async def apublish_webhook(self, target: AsyncTarget, topic: str, payload: Any = None,
                               **options: Unpack[EnqueueOptions]) -> int:  # fmt: skip
        """``publish_webhook`` for asyncio."""
        return await self._async_writes.apublish_webhook(target, topic, payload, options)

    async def adispose(self) -> None:
        """Close dbqueue's own asyncio engine's connections in the running event loop."""
        await self._async_writes.adispose()

    # ---- results and cancellation -------------------------------------------------------------
    def result(
        self, job_id: int, timeout: float | None = None, target: Target | None = None
    ) -> Any:
        """The result a job's handler returned; ``timeout``: seconds to wait for it."""
        return self._results.result(job_id, timeout, target)

    def call(self, task: str, payload: Any = None, timeout: float | None = 30.0,
             **options: Unpack[EnqueueOptions]) -> Any:  # fmt: skip
        """Enqueue ``task``, wait for a worker to run it, and return its handler's result."""
        return self._results.call(task, payload, timeout, **options)

    def cancel(self, ids: int | Iterable[int], target: Target | None = None) -> dict[int, str]:
        """Cancel jobs; returns job id → what became of it, in the order given."""
        return self._cancellation.cancel(ids, target)

    async def aresult(self, job_id: int, timeout: float | None = None,
                      target: AsyncTarget = None) -> Any:  # fmt: skip
        """``result`` for asyncio: awaits the job without blocking the event loop."""
        return await self._results.aresult(job_id, timeout, target)

    async def acall(self, task: str, payload: Any = None, timeout: float | None = 30.0,
                    **options: Unpack[EnqueueOptions]) -> Any:  # fmt: skip
        """``call`` for asyncio: awaits the job's result without blocking the event loop."""
        return await self._results.acall(task, payload, timeout, options)

    async def acancel(self, ids: int | Iterable[int], target: AsyncTarget = None) -> dict[int, str]:
        """``cancel`` for asyncio (an AsyncSession, AsyncConnection or None)."""
        return await self._results.acancel(ids, target)

    def cancel_publication(
        self, publication_id: int, target: Target | None = None
    ) -> dict[int, str]:
        """Cancel every delivery of one publication, as ``cancel`` does."""
        return self._cancellation.cancel_publication(publication_id, target)

    # ---- subscriptions ------------------------------------------------------------------------
    def add_subscription(self, target: Target | None, subscription_id: str, topic: str, *,
                         tenant: int | None = None, business_group: str | None = None,
                         url: str | None = None, method: str = DEFAULT_HTTP_METHOD,
                         headers: Mapping[str, Any] | None = None,
                         active: bool = True) -> Subscription:  # fmt: skip
        """Subscribe ``subscription_id`` to ``topic`` (with a ``url``: by webhook)."""
        return self._subscriptions.add(
            target, subscription_id, topic, tenant, business_group, url, method, headers, active
        )

    def subscriptions(
        self, topic: str | None = None, *, active: bool | None = None, target: Target | None = None
    ) -> list[Subscription]:
        """The subscriptions (of one topic; only the active or inactive ones), by topic and id."""
        return self._subscriptions.find(topic, active, target)

    def get_subscription(
        self, subscription_id: str, target: Target | None = None
    ) -> Subscription | None:
        """One subscription (None: there is no such subscription)."""
        return self._subscriptions.get(subscription_id, target)

    def enable_subscription(self, target: Target | None, subscription_id: str) -> Subscription:
        """Let the subscription receive publications again."""
        return self._subscriptions.set_active(target, subscription_id, True)

    def disable_subscription(self, target: Target | None, subscription_id: str) -> Subscription:
        """Stop the subscription receiving publications (it stays in the table)."""
        return self._subscriptions.set_active(target, subscription_id, False)

    def update_subscription(
        self, target: Target | None, subscription_id: str, **changes: Unpack[SubscriptionChanges]
    ) -> Subscription:
        """Change a subscription's topic, filters, webhook or active flag; returns the new row."""
        return self._subscriptions.update(target, subscription_id, changes)

    def remove_subscription(self, target: Target | None, subscription_id: str) -> Subscription:
        """Delete a subscription; returns the row it was."""
        return self._subscriptions.remove(target, subscription_id)

    # ---- jobs and the morgue ------------------------------------------------------------------
    def get_job(self, job_id: int, target: Target | None = None) -> dict[str, Any] | None:
        """One job row as a dict (None if there is no such job)."""
        return self._jobs.get_job(job_id, target)

    def find_equivalent(self, target: Target | None, task: str, payload: Any, *,
                        statuses: Sequence[str] = Status.PENDING, queue: str | None = UNFILTERED,
                        external_key: str | None = UNFILTERED, origin: str | None = UNFILTERED,
                        destination: str | None = UNFILTERED, tenant: int | None = UNFILTERED,
                        business_group: str | None = UNFILTERED,
                        ) -> list[dict[str, Any]]:  # fmt: skip
        """Jobs of ``task`` with the same payload in one of ``statuses`` (default: pending)."""
        return self._jobs.find_equivalent(
            target, task, payload, statuses, queue, external_key, origin, destination, tenant,
            business_group,
        )  # fmt: skip

    def dead_jobs(self, queue: str | None = None, limit: int = 100, target: Target | None = None,
                  *, task: str | None = None,
                  order_by: str = "finished_at") -> list[dict[str, Any]]:  # fmt: skip
        """Dead jobs (every column), of one ``queue`` / ``task`` when given, at most ``limit``."""
        return self._morgue.dead_jobs(queue, limit, target, task=task, order_by=order_by)

    def requeue_dead(self, ids: Sequence[int] | None = None, target: Target | None = None, *,
                     task: str | None = None, queue: str | None = None) -> list[int]:  # fmt: skip
        """Run dead jobs again from attempt 1; returns the ids requeued, sorted."""
        return self._morgue.requeue_dead(ids, target, task=task, queue=queue)

    def delete_dead(self, ids: Sequence[int] | None = None, target: Target | None = None, *,
                    task: str | None = None, queue: str | None = None) -> list[int]:  # fmt: skip
        """Delete dead jobs for good; returns the ids deleted, sorted."""
        return self._morgue.delete_dead(ids, target, task=task, queue=queue)

    # ---- monitoring and maintenance -----------------------------------------------------------
    def stats(self, target: Target | None = None) -> list[QueueSummary]:
        """Per queue: its jobs counted by status, and the oldest runnable job's age."""
        return self._monitoring.stats(target)

    def workers(
        self, *, include_gone: bool = False, target: Target | None = None
    ) -> list[WorkerInfo]:
        """The worker processes in the registry of live workers, oldest first."""
        return self._monitoring.workers(include_gone=include_gone, target=target)

    def stats_report(self, target: Target | None = None) -> dict[str, Any]:
        """What ``/api/v1/stats`` and ``dbqueue stats --json`` return, in Lowkiq's shape."""
        return self._monitoring.stats_report(target)

    def run_maintenance(self, routine: str, *, strategy: str | None = None) -> str:
        """Run one maintenance routine now (``purge``, ``rescue`` or ``renotify``)."""
        return self._maintenance.run_maintenance(routine, strategy=strategy)

    def maintenance_status(self, target: Target | None = None) -> list[dict[str, Any]]:
        """One row per routine: last tick, who ran it, when, how many runs, the result."""
        return self._maintenance.maintenance_status(target)

    def migrate(self, revision: str = "head") -> None:
        """Create or upgrade the queue tables (the same migrations as ``dbqueue migrate``)."""
        self._maintenance.migrate(revision)

    # ---- workers ------------------------------------------------------------------------------
    def worker(self, **options: Any) -> Worker:
        """A Worker for this App; see ``dbqueue.Worker`` for the options."""
        return Worker(self, **options)

    def run_worker(self, **options: Any) -> WorkerSummary:
        """Run a worker in this thread until it stops (signal, --burst, or a limit)."""
        return self.worker(**options).run()

"""``dbqueue.App``: configuration, task registry and the client API in one object."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import os
import socket
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from . import dialects
from . import payload as payload_codec
from .client import Target, _check_int, build_job, connection_for
from .config import Settings, parse_url, resolve_url
from .engine import NewJob, QueueEngine, QueueStats
from .errors import ConfigurationError
from .identifiers import check_queue_name, check_subscription_id, check_task_name
from .job import Status
from .maintenance import MaintenanceSettings
from .poollog import quiet_reset_failures
from .pubsub import (
    PUBLICATION_MARKER,
    Subscription,
    SubscriptionStore,
    new_subscription_values,
    publication_message,
)
from .retry import DEFAULT_BASE_INTERVAL, Backoff, linear_backoff
from .schema import (
    DEFAULT_HTTP_METHOD,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    TableNames,
    tables_for,
)
from .tasks import Handler, TaskDefinition, TaskRegistry
from .webhooks import DEFAULT_WEBHOOK_TIMEOUT, WebhookHandler, WebhookSender

if TYPE_CHECKING:
    from .lockserver.client import LockServerClient
    from .worker import Worker, WorkerSummary

_ANY: Any = object()  # "do not filter on this column"


class App:
    """A queue: where its tables live, which tasks it knows, and how to enqueue and consume.

    ``App("postgresql+psycopg2://…")`` or ``App(engine)``; with no argument the URL comes from
    DBQUEUE_URL, else the seed's DB_*/DATABASE_* variables, else ``sqlite:///dbqueue.db``.
    Creating an App never connects; the first enqueue or worker does. ``lock_server``
    ("HOST:PORT", default $DBQUEUE_LOCK_SERVER) is where the lock_server strategy takes its
    locks and where enqueues hint that work is available.
    """

    def __init__(
        self,
        url: str | Engine | None = None,
        *,
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
        settings: Settings | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        base = settings if settings is not None else Settings.from_env(environ)
        self.settings = base.merged(
            url=url if isinstance(url, str) else None,
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
        )
        self._environ = environ
        self._engine: Engine | None = url if isinstance(url, Engine) else None
        if url is not None and not isinstance(url, (str, Engine)):
            raise ConfigurationError(
                f"App() takes a database URL or a SQLAlchemy Engine, not {type(url).__name__}"
            )
        s = self.settings
        self.names = TableNames.resolve(
            s.table_prefix, s.schema, s.jobs_table, s.subscriptions_table
        )
        self.tables = tables_for(self.names)
        self.default_queue = check_queue_name(s.queue or DEFAULT_QUEUE)
        self.max_attempts = s.max_attempts or DEFAULT_MAX_ATTEMPTS
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts={self.max_attempts} must be at least 1")
        self.backoff: Backoff = backoff or linear_backoff(
            DEFAULT_BASE_INTERVAL if s.retry_base_interval is None else s.retry_base_interval
        )
        self.max_payload_bytes = (
            s.max_payload_bytes
            if s.max_payload_bytes is not None
            else payload_codec.DEFAULT_MAX_PAYLOAD_BYTES
        )
        self.subscription_store = SubscriptionStore(self.tables)
        self.webhook_sender = WebhookSender(
            DEFAULT_WEBHOOK_TIMEOUT if s.webhook_timeout is None else s.webhook_timeout
        )
        self.registry = TaskRegistry()
        self._queue_engines: dict[int, QueueEngine] = {}
        self._lock = threading.Lock()
        #: Workers running in this process: a local enqueue wakes them when it commits.
        self.local_workers: weakref.WeakSet[Worker] = weakref.WeakSet()
        #: Where enqueues hint the lock server (None: not decided yet; False: no lock server).
        self._hint_client: LockServerClient | bool | None = None
        #: Connections whose commit will wake workers, with the queues their enqueues used.
        self._connections_to_wake: weakref.WeakKeyDictionary[Connection, set[str]] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def registry(self) -> TaskRegistry:
        """Task names and subscribers → handlers."""
        return self._registry

    @registry.setter
    def registry(self, registry: TaskRegistry) -> None:
        # Deliveries no code handles become webhook calls with *this* App's subscriptions
        # table, also when a registry is taken over from another App (``--app`` + ``--url``).
        registry.subscriber_fallback = WebhookHandler(self.subscription_store, self.webhook_sender)
        self._registry = registry

    @property
    def maintenance_settings(self) -> MaintenanceSettings:
        s = self.settings
        defaults = MaintenanceSettings()
        return MaintenanceSettings(
            rescue_minutes=s.rescue_minutes or defaults.rescue_minutes,
            purge_minutes=s.purge_minutes or defaults.purge_minutes,
            notify_minutes=s.notify_minutes or defaults.notify_minutes,
            purge_max_age_days=defaults.purge_max_age_days
            if s.purge_max_age_days is None
            else s.purge_max_age_days,
            purge_limit=s.purge_limit or defaults.purge_limit,
            tick_seconds=s.maintenance_tick or defaults.tick_seconds,
        )

    # ---- database -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self._engine is not None:
            return self._engine.url.render_as_string(hide_password=False)
        return resolve_url(self.settings.url, self.settings.dialect, self._environ)

    @property
    def engine(self) -> Engine:
        """The App's own engine (created on first use when the App was given a URL)."""
        with self._lock:
            if self._engine is None:
                self._engine = self.create_engine()
            return self._engine

    def create_engine(self, **kwargs: Any) -> Engine:
        """A new engine on the App's database, configured the way dbqueue needs it."""
        url = parse_url(self.url)
        cls = dialects.class_for_url(url)
        options = {**cls.engine_kwargs(), **kwargs}
        try:
            engine = sa.create_engine(cls.normalize_url(url), **options)
        except (sa.exc.ArgumentError, ImportError) as exc:
            raise ConfigurationError(f"cannot create an engine for {url!r}: {exc}") from None
        cls.configure_engine(engine)
        quiet_reset_failures(engine)
        return engine

    def queue_engine(self, conn: Connection) -> QueueEngine:
        """The lifecycle engine for this App's tables on ``conn``'s database."""
        key = id(conn.dialect)
        found = self._queue_engines.get(key)
        if found is None or found.dialect.sa_dialect is not conn.dialect:
            found = QueueEngine(self.tables, dialects.for_sqlalchemy(conn.dialect))
            self._queue_engines[key] = found
        return found

    # ---- task registration --------------------------------------------------------------------
    def task(
        self,
        name: str | None = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | None = None,
        retry_base_interval: float | None = None,
        dead_handler: Handler | None = None,
        timeout: float | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register ``handler(job, session)`` for a task name (default: the function's name).

        ``queue``, ``priority`` and ``max_attempts`` become the defaults for jobs enqueued with
        this task name; ``backoff`` (attempt → seconds) or ``retry_base_interval`` replace the
        App's retry delay for it; ``dead_handler`` runs once the job's attempts are exhausted.
        ``timeout``: seconds a run may take; past it the attempt fails with JobTimeoutError
        and is retried by the usual rules (overrides the worker's ``job_timeout``).
        """
        if backoff is not None and retry_base_interval is not None:
            raise ConfigurationError("pass either backoff or retry_base_interval, not both")
        if retry_base_interval is not None:
            backoff = linear_backoff(retry_base_interval)

        def register(handler: Handler) -> Handler:
            self.registry.register(
                TaskDefinition(
                    name=name or handler.__name__,
                    handler=handler,
                    queue=queue,
                    priority=priority,
                    max_attempts=max_attempts,
                    backoff=backoff,
                    dead_handler=dead_handler,
                    timeout=timeout,
                )
            )
            return handler

        return register

    def dead_handler(self, task: str) -> Callable[[Handler], Handler]:
        """Register ``handler(job, session)`` to run on a task's dead-letter jobs
        (``job.dead`` is True and ``job.live_id`` is the id of the job that died)."""

        def register(handler: Handler) -> Handler:
            self.registry.add_dead_handler(task, handler)
            return handler

        return register

    def subscriber(
        self,
        topic: str,
        subscription_id: str,
        *,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | None = None,
        retry_base_interval: float | None = None,
        dead_handler: Handler | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register ``handler(job, session)`` for the deliveries of one subscription of a topic
        (``job.payload`` is the published payload; ``job.publication_id`` and
        ``job.subscription_id`` say which publication and subscription).

        The options are those of ``task``; ``queue``, ``priority`` and ``max_attempts`` apply to
        deliveries published through an App that has this registration.
        """
        if backoff is not None and retry_base_interval is not None:
            raise ConfigurationError("pass either backoff or retry_base_interval, not both")
        if retry_base_interval is not None:
            backoff = linear_backoff(retry_base_interval)
        check_subscription_id(subscription_id)
        if priority is not None:
            _check_int("priority", priority)
        if max_attempts is not None:
            _check_int("max_attempts", max_attempts, minimum=1)

        def register(handler: Handler) -> Handler:
            self.registry.register_subscriber(
                TaskDefinition(
                    name=topic,
                    handler=handler,
                    queue=queue,
                    priority=priority,
                    max_attempts=max_attempts,
                    backoff=backoff,
                    dead_handler=dead_handler,
                    subscription_id=subscription_id,
                )
            )
            return handler

        return register

    def dead_subscriber(self, topic: str, subscription_id: str) -> Callable[[Handler], Handler]:
        """Register ``handler(job, session)`` for a subscription's deliveries whose attempts are
        exhausted (``job.dead`` is True, ``job.live_id`` is the delivery that died). A webhook
        subscription may have one too."""
        check_subscription_id(subscription_id)

        def register(handler: Handler) -> Handler:
            self.registry.add_dead_subscriber(topic, subscription_id, handler)
            return handler

        return register

    # ---- client API ---------------------------------------------------------------------------
    def _new_job(self, task: str, payload: Any, options: dict[str, Any]) -> NewJob:
        definition = self.registry.get(task)
        queue = (
            options.pop("queue", None) or (definition and definition.queue) or self.default_queue
        )
        priority = options.pop("priority", None)
        if priority is None:
            priority = (
                definition.priority
                if definition and definition.priority is not None
                else DEFAULT_PRIORITY
            )
        max_attempts = options.pop("max_attempts", None)
        if max_attempts is None:
            max_attempts = (definition and definition.max_attempts) or self.max_attempts
        return build_job(
            task,
            payload,
            queue=queue or self.default_queue,
            priority=DEFAULT_PRIORITY if priority is None else priority,
            max_attempts=max_attempts,
            max_payload_bytes=self.max_payload_bytes,
            **options,
        )

    def enqueue(
        self,
        target: Target | None,
        task: str,
        payload: Any = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | dt.timedelta | None = None,
        run_at: dt.datetime | None = None,
        max_attempts: int | None = None,
        external_key: str | None = None,
        origin: str | None = None,
        destination: str | None = None,
        tenant: int | None = None,
        business_group: str | None = None,
    ) -> int:
        """Insert one job in ``target``'s transaction and return its id.

        ``target`` is an ORM Session or a Connection (the job commits or rolls back with the
        caller's work) or an Engine/None (dbqueue commits at once). Lower priority runs first.
        """
        job = self._new_job(
            task,
            payload,
            dict(
                queue=queue,
                priority=priority,
                delay=delay,
                run_at=run_at,
                max_attempts=max_attempts,
                external_key=external_key,
                origin=origin,
                destination=destination,
                tenant=tenant,
                business_group=business_group,
            ),
        )
        with connection_for(self._target(target)) as conn:
            job_id = self.queue_engine(conn).insert(conn, job)
        self._wake_after_commit(target, [job.queue])
        return job_id

    def enqueue_many(self, target: Target | None, jobs: Iterable[Mapping[str, Any]]) -> list[int]:
        """Insert many jobs with one statement; each item is a dict of ``enqueue``'s arguments
        (``task`` required, ``payload`` and the options optional). All are validated first."""
        built = []
        for index, spec in enumerate(jobs):
            options = dict(spec)
            try:
                task = options.pop("task")
            except KeyError:
                raise ConfigurationError(f"enqueue_many: item {index} has no 'task'") from None
            built.append(self._new_job(task, options.pop("payload", None), options))
        if not built:
            return []
        with connection_for(self._target(target)) as conn:
            ids = self.queue_engine(conn).insert_many(conn, built)
        self._wake_after_commit(target, [job.queue for job in built])
        return ids

    def publish(
        self,
        target: Target | None,
        topic: str,
        payload: Any = None,
        *,
        tenant: int | None = None,
        business_group: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | dt.timedelta | None = None,
        run_at: dt.datetime | None = None,
        max_attempts: int | None = None,
        external_key: str | None = None,
        origin: str | None = None,
        destination: str | None = None,
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
        return self._publish(
            target,
            topic,
            payload,
            webhooks_only=False,
            tenant=tenant,
            business_group=business_group,
            queue=queue,
            priority=priority,
            delay=delay,
            run_at=run_at,
            max_attempts=max_attempts,
            external_key=external_key,
            origin=origin,
            destination=destination,
        )

    def publish_webhook(
        self,
        target: Target | None,
        topic: str,
        payload: Any = None,
        *,
        tenant: int | None = None,
        business_group: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | dt.timedelta | None = None,
        run_at: dt.datetime | None = None,
        max_attempts: int | None = None,
        external_key: str | None = None,
        origin: str | None = None,
        destination: str | None = None,
    ) -> int:
        """Like ``publish``, but only subscriptions with a webhook url receive it (the seed's
        ``insert_task_webhook``)."""
        return self._publish(
            target,
            topic,
            payload,
            webhooks_only=True,
            tenant=tenant,
            business_group=business_group,
            queue=queue,
            priority=priority,
            delay=delay,
            run_at=run_at,
            max_attempts=max_attempts,
            external_key=external_key,
            origin=origin,
            destination=destination,
        )

    def _publish(
        self,
        target: Target | None,
        topic: str,
        payload: Any,
        *,
        webhooks_only: bool,
        queue: str | None,
        priority: int | None,
        max_attempts: int | None,
        **options: Any,
    ) -> int:
        check_task_name(topic)
        # Validated and encoded once, before anything touches the database.
        template = build_job(
            topic,
            payload,
            queue=queue or self.default_queue,
            priority=DEFAULT_PRIORITY if priority is None else priority,
            max_attempts=max_attempts or self.max_attempts,
            max_payload_bytes=self.max_payload_bytes,
            **options,
        )
        record = dataclasses.replace(
            template, delay=None, run_at=None, subscription_id=PUBLICATION_MARKER
        )
        with connection_for(self._write_target(target)) as conn:
            reached = self.subscription_store.matching(
                conn, topic, template.tenant, template.business_group, webhooks_only
            )
            message = publication_message(
                topic, reached, template.tenant, template.business_group, webhooks_only
            )
            engine = self.queue_engine(conn)
            publication_id = engine.insert_finished(conn, record, message)
            if reached:
                explicit = {"queue": queue, "priority": priority, "max_attempts": max_attempts}
                deliveries = [
                    self._delivery(template, publication_id, subscription_id, explicit)
                    for subscription_id in reached
                ]
                engine.insert_many(conn, deliveries)
        if reached:
            self._wake_after_commit(target, [delivery.queue for delivery in deliveries])
        return publication_id

    def _delivery(
        self,
        template: NewJob,
        publication_id: int,
        subscription_id: str,
        explicit: dict[str, Any],
    ) -> NewJob:
        """One subscription's job: explicit options, else its subscriber's, else the App's."""
        definition = self.registry.subscriber(template.task, subscription_id)
        changes: dict[str, Any] = {}
        if definition is not None:
            for option in ("queue", "priority", "max_attempts"):
                registered = getattr(definition, option)
                if explicit[option] is None and registered is not None:
                    changes[option] = registered
        return dataclasses.replace(
            template, publication_id=publication_id, subscription_id=subscription_id, **changes
        )

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
        with connection_for(self._write_target(target)) as conn:
            return self.subscription_store.add(conn, values)

    def subscriptions(
        self, topic: str | None = None, *, active: bool | None = None, target: Target | None = None
    ) -> list[Subscription]:
        """The subscriptions (of one topic; only the active or inactive ones), by topic and id."""
        with connection_for(self._target(target)) as conn:
            return self.subscription_store.find(conn, topic, active)

    def get_subscription(
        self, subscription_id: str, target: Target | None = None
    ) -> Subscription | None:
        with connection_for(self._target(target)) as conn:
            return self.subscription_store.get(conn, subscription_id)

    def enable_subscription(self, target: Target | None, subscription_id: str) -> Subscription:
        """Let the subscription receive publications again (a disabled one receives none, and
        its pending webhook deliveries wait, failing their attempts, until it is enabled)."""
        with connection_for(self._write_target(target)) as conn:
            return self.subscription_store.set_active(conn, subscription_id, True)

    def disable_subscription(self, target: Target | None, subscription_id: str) -> Subscription:
        """Stop the subscription receiving publications (it stays in the table)."""
        with connection_for(self._write_target(target)) as conn:
            return self.subscription_store.set_active(conn, subscription_id, False)

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
            return self.queue_engine(conn).find_equivalent(conn, task, encoded, statuses, filters)

    def get_job(self, job_id: int, target: Target | None = None) -> dict[str, Any] | None:
        """One job row as a dict (None if there is no such job)."""
        with connection_for(self._target(target)) as conn:
            return self.queue_engine(conn).get(conn, job_id)

    # ---- monitoring and the dead-job morgue ---------------------------------------------------
    def stats(self, target: Target | None = None) -> list[QueueStats]:
        with connection_for(self._target(target)) as conn:
            return self.queue_engine(conn).stats(conn)[0]

    def dead_jobs(
        self, queue: str | None = None, limit: int = 100, target: Target | None = None
    ) -> list[dict[str, Any]]:
        with connection_for(self._target(target)) as conn:
            return self.queue_engine(conn).dead_jobs(conn, queue, limit)

    def requeue_dead(self, ids: Sequence[int], target: Target | None = None) -> list[int]:
        """Run dead jobs again from attempt 1; returns the ids that were dead and are requeued."""
        if target is None:
            target = self.engine.execution_options(**{dialects.WRITE_INTENT: True})
        with connection_for(target) as conn:
            return self.queue_engine(conn).requeue_dead(conn, list(ids))

    # ---- maintenance --------------------------------------------------------------------------
    def run_maintenance(self, routine: str, *, strategy: str | None = None) -> str:
        """Run one maintenance routine now (``purge``, ``rescue`` or ``renotify``), as the
        workers' leader would, recording it; returns what it did. ``strategy`` decides which
        locks tell a live worker from a dead one (default: the database's strategy)."""
        from . import strategies
        from .maintenance import Maintenance

        if routine not in ("purge", "rescue", "renotify"):
            raise ConfigurationError(
                f"unknown maintenance routine {routine!r}: choose purge, rescue or renotify"
            )
        engine = self.create_engine(execution_options={dialects.WRITE_INTENT: True})
        claim = None
        try:
            with engine.connect() as conn:
                dialect = dialects.for_sqlalchemy(conn.dialect)
            claim = strategies.create(strategy or self.settings.strategy, dialect, self.settings)
            notifier = claim.notifier(engine, self.names) or dialect.notifier(
                engine, self.names.qualified_jobs
            )
            name = f"{socket.gethostname()}:{os.getpid()}:manual"
            maintenance = Maintenance(
                self, engine, claim, notifier, self.maintenance_settings, name
            )
            return maintenance.run_now(routine)
        finally:
            if claim is not None:
                claim.close()
            engine.dispose()

    def maintenance_status(self, target: Target | None = None) -> list[dict[str, Any]]:
        """One row per routine: last tick, who ran it, when, how many runs, the result."""
        with connection_for(self._target(target)) as conn:
            return self.queue_engine(conn).maintenance_status(conn)

    # ---- schema -------------------------------------------------------------------------------
    def migrate(self, revision: str = "head") -> None:
        """Create or upgrade the queue tables (the same migrations as ``dbqueue migrate``)."""
        from .migrate import upgrade

        upgrade(self.engine, self.names, revision)

    # ---- workers ------------------------------------------------------------------------------
    def worker(self, **options: Any) -> Worker:
        """A Worker for this App; see ``dbqueue.Worker`` for the options."""
        from .worker import Worker

        return Worker(self, **options)

    def run_worker(self, **options: Any) -> WorkerSummary:
        """Run a worker in this thread until it stops (signal, --burst, or a limit)."""
        return self.worker(**options).run()

    def _target(self, target: Target | None) -> Target:
        return self.engine if target is None else target

    def _write_target(self, target: Target | None) -> Target:
        """Like ``_target``, for statements that read and then write: dbqueue's own transaction
        takes its write lock first where the database locks whole (SQLite)."""
        if target is None:
            target = self.engine
        if isinstance(target, Engine):
            return target.execution_options(**{dialects.WRITE_INTENT: True})
        return target

    def _wake_after_commit(self, target: Target | None, queues: Sequence[str]) -> None:
        """Wake this process's workers, and hint the lock server, once the enqueue is committed
        (not before: they would look for a job they cannot see yet)."""
        hints = self._hints()
        if not self.local_workers and hints is None:
            return
        wake = functools.partial(self._wake, hints, sorted(set(queues)))
        if target is None or isinstance(target, Engine):
            wake()  # dbqueue's own transaction has committed
        elif isinstance(target, Session):
            pending = target.info.setdefault("dbqueue_wake", set())
            if not pending:
                sa.event.listen(target, "after_commit", self._wake_session, once=True)
            pending.update(queues)
        elif isinstance(target, Connection):
            # Core has no after-commit event: "commit" fires just before it. The workers are
            # told the wake is early, and look again a few times soon after. One listener per
            # transaction, however many jobs it enqueues.
            pending = self._connections_to_wake.get(target)
            if pending is None:
                pending = self._connections_to_wake[target] = set()
                sa.event.listen(target, "commit", self._wake_connection, once=True)
            pending.update(queues)

    def _wake(
        self, hints: LockServerClient | None, queues: Sequence[str], early: bool = False
    ) -> None:
        for worker in list(self.local_workers):
            worker.wake(early=early)
        if hints is not None:
            hints.hint(queues)  # never blocks: dropped or kept for later without a connection

    def _wake_connection(self, conn: Connection) -> None:
        queues = sorted(self._connections_to_wake.pop(conn, set()))
        self._wake(self._hints(), queues, early=True)

    def _wake_session(self, session: Session) -> None:
        self._wake(self._hints(), sorted(session.info.pop("dbqueue_wake", set())))

    def _hints(self) -> LockServerClient | None:
        """The lock server connection enqueues hint, when this App's jobs are claimed through
        one (``lock_server`` set, or the lock_server strategy, the default on SingleStore)."""
        if self._hint_client is None:
            with self._lock:
                if self._hint_client is None:
                    self._hint_client = self._connect_hints() or False
        return self._hint_client or None

    def _connect_hints(self) -> LockServerClient | None:
        from . import lockserver
        from .lockserver import client

        s = self.settings
        try:
            if self._engine is not None:
                cls = dialects.class_for_sqlalchemy_name(self._engine.dialect.name)
            else:
                cls = dialects.class_for_url(parse_url(self.url))
        except ConfigurationError:
            return None
        if not s.lock_server and (s.strategy or cls.default_strategy) != "lock_server":
            return None
        return client.connect(
            lockserver.notify_address(s),
            token=s.lock_server_token,
            timeout=lockserver.message_timeout(s),
        )

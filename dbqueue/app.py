"""``dbqueue.App``: configuration, task registry and the client API in one object."""

from __future__ import annotations

import datetime as dt
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
from .client import Target, build_job, connection_for
from .config import Settings, parse_url, resolve_url
from .engine import NewJob, QueueEngine, QueueStats
from .errors import ConfigurationError
from .identifiers import check_queue_name
from .job import Status
from .maintenance import MaintenanceSettings
from .retry import DEFAULT_BASE_INTERVAL, Backoff, linear_backoff
from .schema import DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY, DEFAULT_QUEUE, TableNames, tables_for
from .tasks import Handler, TaskDefinition, TaskRegistry

if TYPE_CHECKING:
    from .worker import Worker, WorkerSummary

_ANY: Any = object()  # "do not filter on this column"


class App:
    """A queue: where its tables live, which tasks it knows, and how to enqueue and consume.

    ``App("postgresql+psycopg2://…")`` or ``App(engine)``; with no argument the URL comes from
    DBQUEUE_URL, else the seed's DB_*/DATABASE_* variables, else ``sqlite:///dbqueue.db``.
    Creating an App never connects; the first enqueue or worker does.
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
        self.registry = TaskRegistry()
        self._queue_engines: dict[int, QueueEngine] = {}
        self._lock = threading.Lock()
        #: Workers running in this process: a local enqueue wakes them when it commits.
        self.local_workers: weakref.WeakSet[Worker] = weakref.WeakSet()

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
    ) -> Callable[[Handler], Handler]:
        """Register ``handler(job, session)`` for a task name (default: the function's name).

        ``queue``, ``priority`` and ``max_attempts`` become the defaults for jobs enqueued with
        this task name; ``backoff`` (attempt → seconds) or ``retry_base_interval`` replace the
        App's retry delay for it; ``dead_handler`` runs once the job's attempts are exhausted.
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
        self._wake_after_commit(target)
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
        self._wake_after_commit(target)
        return ids

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

    def _wake_local_workers(self, *args: Any) -> None:
        for worker in list(self.local_workers):
            worker.wake()

    def _wake_after_commit(self, target: Target | None) -> None:
        """Wake this process's workers once the enqueue is committed (not before: they would
        look for a job they cannot see yet)."""
        if not self.local_workers:
            return
        if target is None or isinstance(target, Engine):
            self._wake_local_workers()  # dbqueue's own transaction has committed
        elif isinstance(target, Session):
            if not target.info.get("dbqueue_wake"):
                target.info["dbqueue_wake"] = True
                sa.event.listen(target, "after_commit", self._wake_session, once=True)
        elif isinstance(target, Connection):
            # Core has no after-commit event: "commit" fires just before it. A wake that comes
            # too early costs one short poll (the worker polls quickly after a wake-up).
            sa.event.listen(target, "commit", self._wake_local_workers, once=True)

    def _wake_session(self, session: Session) -> None:
        session.info.pop("dbqueue_wake", None)
        self._wake_local_workers()

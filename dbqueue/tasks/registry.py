"""Task definitions: the handler for each task name (and each pub/sub subscriber), with its queue
and retry policy."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dbqueue.base.identifiers import check_queue_name, check_subscription_id, check_task_name
from dbqueue.errors import ConfigurationError, UnknownTaskError
from dbqueue.job import Job
from dbqueue.tasks.hooks import WorkerHooks
from dbqueue.tasks.schedules import ScheduleBook
from dbqueue.tasks.signatures import BATCH, TASK, TENANT_TASK, check_signature

#: A backoff maps the number of the attempt that just failed (1, 2, …) to seconds to wait.
Backoff = Callable[[int], float]

Handler = Callable[..., Any]

#: ``key_mode``: jobs sharing a key run in enqueue order, a failed attempt keeping its place
#: (the default); or ``exclusive``: only never two at once, a failed attempt goes to the back.
ORDERED = "ordered"
EXCLUSIVE = "exclusive"
KEY_MODES = (ORDERED, EXCLUSIVE)


@dataclass(frozen=True)
class BatchOptions:
    """A batch task's (``@app.batch_task``): its handler gets up to ``max_size`` jobs at once;
    a worker that claimed some waits up to ``max_wait`` seconds for more."""

    max_size: int
    max_wait: float


@dataclass
class TaskDefinition:
    name: str
    handler: Handler | None
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    backoff: Backoff | None = None
    dead_handler: Handler | None = None
    #: seconds a run may take before it is interrupted with JobTimeoutError (None: no limit).
    timeout: float | None = None
    options: dict[str, Any] = field(default_factory=dict)
    #: How jobs of this task that share a key wait for each other (KEY_MODES).
    key_mode: str = ORDERED
    #: Enqueues with the same key merge into the job of the key that waits (``job.payloads``).
    coalesce: bool = False
    #: For a subscriber: the subscription id it handles (``name`` is then the topic, or ``*``
    #: for "any topic", as the seed's ``@Subscriber(id)`` registers).
    subscription_id: str | None = None
    #: For a batch task: its handler is ``handler(jobs, session)``.
    batch: BatchOptions | None = None
    #: Whether its jobs run inside their claim's transaction (None: the App's default). False:
    #: the claim commits the job as running under a lease; the handler runs outside any
    #: transaction of dbqueue's and its session commits its own writes.
    transaction: bool | None = None


ANY_TOPIC = "*"


@dataclass(frozen=True)
class TenantHandler:
    """A handler that takes the tenant's database session too: ``handler(job, session,
    tenant_session)`` (``tenant_database=True``). The worker opens the session on the job's
    tenant and calls ``call``; equal when they wrap the same function."""

    handler: Handler

    def call(self, job: Job, session: Any, tenant_session: Any) -> Any:
        return self.handler(job, session, tenant_session)

    def __call__(self, job: Job, session: Any) -> Any:
        raise TypeError(
            f"{_describe(self.handler)} takes the tenant's database (tenant_database=True): "
            "only a worker can call it"
        )


def for_tenants(handler: Any, tenant_database: bool | None) -> Any:
    """The handler as registered: wrapped when it takes the tenant's database."""
    if not tenant_database or handler is None or isinstance(handler, TenantHandler):
        return handler
    return TenantHandler(handler)


class TaskRegistry:
    """Task name → definition, and (topic, subscription id) → subscriber definition.

    An optional catch-all serves every other task name (WorkerBase). A delivery of a pub/sub
    publication (a job with a ``subscription_id``) goes to its subscriber's code, else to the
    fallback the worker passes (its webhook handler), never to the catch-all.
    """

    def __init__(self) -> None:
        self._tasks: dict[str, TaskDefinition] = {}
        self._subscribers: dict[tuple[str, str], TaskDefinition] = {}
        self.catch_all: TaskDefinition | None = None
        #: Periodic schedules (``@app.periodic`` / ``app.schedule``): which tasks to enqueue when.
        self.schedules = ScheduleBook()
        #: queue → how many of its jobs may run at once across all workers (``app.queue``).
        self.queue_limits: dict[str, int] = {}
        #: Middlewares around every handler, and the workers' start/stop/error hooks.
        self.hooks = WorkerHooks()
        #: Whether any task takes its jobs in batches (else no job needs looking at for it).
        self.has_batches = False
        #: The execution mode of tasks that do not choose one (``App(transaction=…)``).
        self._default_transaction = True
        #: Whether any job may run outside its claim's transaction (else none is looked at).
        self.has_leased = False

    # ---- tasks ----------------------------------------------------------------------------
    def register(self, definition: TaskDefinition) -> TaskDefinition:
        check_task_name(definition.name)
        if definition.queue is not None:
            check_queue_name(definition.queue)
        if definition.timeout is not None:
            definition.timeout = check_timeout(definition.timeout, f"task {definition.name!r}")
        _check_handlers(definition, f"task {definition.name!r}")
        existing = self._tasks.get(definition.name)
        _check_not_twice(f"task {definition.name!r}", existing, definition)
        if existing is not None:
            _merge(existing, definition)
        self._tasks[definition.name] = definition
        self.has_batches = self.has_batches or definition.batch is not None
        self.has_leased = self.has_leased or definition.transaction is False
        return definition

    # ---- execution modes ------------------------------------------------------------------
    @property
    def default_transaction(self) -> bool:
        return self._default_transaction

    @default_transaction.setter
    def default_transaction(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise ConfigurationError(
                f"transaction={value!r} must be True (jobs run in their claim's transaction) "
                "or False (outside it, under a lease)"
            )
        self._default_transaction = value
        self.has_leased = self.has_leased or not value

    def in_transaction(self, job: Job) -> bool:
        """Whether ``job`` runs inside its claim's transaction (its task's mode, else the
        App's default); a dead-letter job runs as its task does."""
        if not self.has_leased:
            return True
        definition = self.definition_of(job) or self.catch_all
        chosen = definition.transaction if definition is not None else None
        return self._default_transaction if chosen is None else chosen

    def add_dead_handler(self, name: str, handler: Handler) -> None:
        check_handler(handler, f"dead handler of task {name!r}", TASK)
        definition = self._tasks.get(name)
        if definition is None:
            definition = self.register(TaskDefinition(name=name, handler=None))
        definition.dead_handler = handler

    def get(self, name: str) -> TaskDefinition | None:
        return self._tasks.get(name)

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def handles(self, name: str) -> bool:
        """Whether a worker with this registry runs jobs of task ``name``."""
        definition = self._tasks.get(name)
        return self.catch_all is not None or (
            definition is not None and definition.handler is not None
        )

    # ---- subscribers ----------------------------------------------------------------------
    def register_subscriber(self, definition: TaskDefinition) -> TaskDefinition:
        """Register code for one subscription; ``definition.name`` is its topic (or ``*``)."""
        if definition.name != ANY_TOPIC:
            check_task_name(definition.name)
        assert definition.subscription_id is not None
        check_subscription_id(definition.subscription_id)
        if definition.queue is not None:
            check_queue_name(definition.queue)
        key = (definition.name, definition.subscription_id)
        self.has_leased = self.has_leased or definition.transaction is False
        existing = self._subscribers.get(key)
        what = f"subscriber {definition.subscription_id!r} of topic {definition.name!r}"
        _check_handlers(definition, what)
        _check_not_twice(what, existing, definition)
        if existing is not None:
            _merge(existing, definition)
        self._subscribers[key] = definition
        return definition

    def add_dead_subscriber(self, topic: str, subscription_id: str, handler: Handler) -> None:
        what = f"dead subscriber {subscription_id!r} of topic {topic!r}"
        check_handler(handler, what, TASK)
        definition = self._subscribers.get((topic, subscription_id))
        if definition is None:
            definition = self.register_subscriber(
                TaskDefinition(name=topic, handler=None, subscription_id=subscription_id)
            )
        definition.dead_handler = handler

    def subscriber(self, topic: str, subscription_id: str) -> TaskDefinition | None:
        """The definition for a subscription: registered for its topic, else for any topic."""
        return self._subscribers.get((topic, subscription_id)) or self._subscribers.get(
            (ANY_TOPIC, subscription_id)
        )

    def subscribers(self) -> list[tuple[str, str]]:
        """(topic, subscription id) of each subscriber with code (topic ``*``: any topic)."""
        return sorted(key for key, d in self._subscribers.items() if d.handler is not None)

    def _subscriber_handlers(self, topic: str, subscription_id: str) -> tuple[Any, Any]:
        """(handler, dead handler), each from the topic's registration, else any topic's."""
        found = [
            self._subscribers.get((topic, subscription_id)),
            self._subscribers.get((ANY_TOPIC, subscription_id)),
        ]
        handler = next((d.handler for d in found if d and d.handler), None)
        dead = next((d.dead_handler for d in found if d and d.dead_handler), None)
        return handler, dead

    # ---- lookups the worker makes ---------------------------------------------------------
    def has_async_handlers(self) -> bool:
        """Whether any handler is an ``async def``: the worker then runs its slots on an event
        loop (plain handlers on the slots' threads)."""
        definitions = [*self._tasks.values(), *self._subscribers.values()]
        if self.catch_all is not None:
            definitions.append(self.catch_all)
        return any(
            is_async_callable(handler)
            for d in definitions
            for handler in (d.handler, d.dead_handler)
            if handler is not None
        )

    def is_empty(self) -> bool:
        return not self._tasks and not self._subscribers and self.catch_all is None

    def queues(self) -> list[str]:
        definitions = [*self._tasks.values(), *self._subscribers.values()]
        return sorted({d.queue for d in definitions if d.queue is not None})

    def definition_of(self, job: Job) -> TaskDefinition | None:
        """The registered definition a job's retry policy comes from (none: the App's)."""
        if job.subscription_id is not None:
            return self.subscriber(job.task, job.subscription_id)
        return self._tasks.get(job.task)

    def key_mode_for(self, job: Job) -> str:
        definition = self.definition_of(job)
        return definition.key_mode if definition is not None else ORDERED

    def backoff_for(self, job: Job) -> Backoff | None:
        definition = self.definition_of(job)
        return definition.backoff if definition is not None else None

    def definition_for(self, job: Job) -> TaskDefinition:
        definition = self._tasks.get(job.task)
        if definition is not None and definition.handler is not None:
            return definition
        if self.catch_all is not None:
            return self.catch_all
        known = ", ".join(repr(n) for n in self.names()) or "none"
        raise UnknownTaskError(
            f"unknown task {job.task!r}: no handler is registered for it in this worker "
            f"(registered: {known}). Register it with @app.task({job.task!r}) in the module "
            "passed to --app, or run a worker that has it on this queue."
        )

    def resolve(
        self, job: Job, fallback: Handler | None = None
    ) -> tuple[TaskDefinition | None, Handler]:
        """The job's definition (None for a delivery no code registered: a webhook) and the
        handler to call (its dead handler for a dead-letter job; ``fallback`` for a delivery no
        code handles); UnknownTaskError, naming the fix, when there is none."""
        if job.subscription_id is not None:
            return self.definition_of(job), self._delivery_handler(job, fallback)
        definition = self.definition_for(job)
        if job.dead:
            if definition.dead_handler is None:
                raise UnknownTaskError(
                    f"job {job.id} is a dead-letter job of task {job.task!r}, but no dead handler "
                    f"is registered for it: add @app.dead_handler({job.task!r})"
                )
            return definition, definition.dead_handler
        assert definition.handler is not None
        return definition, definition.handler

    def _delivery_handler(self, job: Job, fallback: Handler | None) -> Handler:
        handler, dead_handler = self._subscriber_handlers(job.task, job.subscription_id)
        if job.dead:
            if dead_handler is None:
                raise UnknownTaskError(
                    f"job {job.id} is a dead-letter delivery of subscription "
                    f"{job.subscription_id!r} (topic {job.task!r}), but no dead handler is "
                    f"registered for it: add @app.dead_subscriber({job.task!r}, "
                    f"{job.subscription_id!r})"
                )
            return dead_handler
        if handler is not None:
            return handler
        if fallback is not None:
            return fallback
        raise UnknownTaskError(
            f"no subscriber is registered for subscription {job.subscription_id!r} of topic "
            f"{job.task!r} in this worker: add @app.subscriber({job.task!r}, "
            f"{job.subscription_id!r}), or give the subscription a webhook url"
        )

    def batch_of(self, job: Job) -> BatchOptions | None:
        """The batch options of the job's task, if its handler takes jobs in batches (a
        dead-letter job runs its dead handler alone, a delivery its subscriber's code)."""
        if not self.has_batches or job.dead or job.subscription_id is not None:
            return None
        definition = self._tasks.get(job.task)
        return definition.batch if definition is not None and definition.handler else None

    def has_dead_handler(self, job: Job) -> bool:
        if job.subscription_id is not None:
            return self._subscriber_handlers(job.task, job.subscription_id)[1] is not None
        definition = self._tasks.get(job.task) or self.catch_all
        return definition is not None and definition.dead_handler is not None


def check_handler(handler: Handler, what: str, arguments: tuple[str, ...]) -> None:
    """Refuse a handler that cannot take what the worker will call it with (``arguments``;
    one that takes the tenant's database gets ``tenant_session`` after them)."""
    if isinstance(handler, TenantHandler):
        handler, arguments = handler.handler, TENANT_TASK
    check_signature(handler, what, arguments)


def _check_handlers(definition: TaskDefinition, what: str) -> None:
    """A definition's handler (``handler(jobs, session)`` for a batch task) and dead handler
    (always one job at a time)."""
    if definition.handler is not None:
        check_handler(definition.handler, what, BATCH if definition.batch else TASK)
    if definition.dead_handler is not None:
        check_handler(definition.dead_handler, f"dead handler of {what}", TASK)


def _check_not_twice(what: str, existing: TaskDefinition | None, new: TaskDefinition) -> None:
    if (
        existing is not None
        and existing.handler is not None
        and new.handler is not None
        and existing.handler != new.handler
    ):
        raise ConfigurationError(
            f"{what} is registered twice ({_describe(existing.handler)} and "
            f"{_describe(new.handler)}): give one of them another name"
        )


def _merge(existing: TaskDefinition, new: TaskDefinition) -> None:
    """A dead handler registered before its task (or the reverse): merge the two."""
    new.dead_handler = new.dead_handler or existing.dead_handler
    new.handler = new.handler or existing.handler


def is_async_callable(handler: Any) -> bool:
    if isinstance(handler, TenantHandler):
        handler = handler.handler
    while isinstance(handler, functools.partial):
        handler = handler.func
    call = getattr(handler, "__call__", None)  # noqa: B004 - an instance with async __call__
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


def check_timeout(value: Any, what: str) -> float:
    """A timeout is a positive number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigurationError(
            f"{what}: timeout={value!r} must be a positive number of seconds (e.g. 30)"
        )
    return float(value)


def _describe(handler: Handler) -> str:
    if isinstance(handler, TenantHandler):
        handler = handler.handler
    module = getattr(handler, "__module__", "?")
    return f"{module}.{getattr(handler, '__qualname__', repr(handler))}"

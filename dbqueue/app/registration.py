"""Registering handlers on an App: tasks, dead handlers, subscribers, middlewares and the
workers' hooks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from typing_extensions import Unpack

from dbqueue.base.identifiers import check_subscription_id
from dbqueue.errors import ConfigurationError
from dbqueue.runtime.enqueue import _check_int
from dbqueue.tasks.registry import (
    KEY_MODES,
    ORDERED,
    BatchOptions,
    Handler,
    TaskDefinition,
    for_tenants,
)
from dbqueue.tasks.retry import Backoff, linear_backoff

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext

#: A decorated handler keeps its own signature for type checkers.
H = TypeVar("H", bound=Handler)
M = TypeVar("M", bound=Callable[..., Any])


class HandlerOptions(TypedDict, total=False):
    """The options of ``@app.task`` and ``@app.subscriber``, written once."""

    queue: str | None  # default queue of its jobs
    priority: int | None  # default priority of its jobs
    max_attempts: int | None  # default attempts of its jobs
    backoff: Backoff | None  # attempt -> seconds before the retry
    retry_base_interval: float | None  # or: base × attempt (not with backoff)
    dead_handler: Handler | None  # runs once the job's attempts are exhausted
    key_mode: str | None  # "ordered" (default) or "exclusive": how jobs sharing a key wait
    coalesce: bool | None  # enqueues of a key merge into its waiting job (job.payloads)
    # handler(job, session, tenant_session): an ORM Session on the job's tenant's database
    tenant_database: bool | None
    # False: run outside the claim's transaction, under a lease (None: the App's default)
    transaction: bool | None


def _definition(
    call: str, name: str, handler: Handler, options: Mapping[str, Any], **extra: Any
) -> TaskDefinition:
    unknown = sorted(set(options) - set(HandlerOptions.__annotations__))
    if unknown:
        raise TypeError(f"{call}() got unexpected keyword argument(s) {', '.join(unknown)}")
    backoff, base_interval = options.get("backoff"), options.get("retry_base_interval")
    if backoff is not None and base_interval is not None:
        raise ConfigurationError("pass either backoff or retry_base_interval, not both")
    if base_interval is not None:
        backoff = linear_backoff(base_interval)
    key_mode = options.get("key_mode") or ORDERED
    if key_mode not in KEY_MODES:
        raise ConfigurationError(
            f"{call} {name!r}: key_mode={key_mode!r} is not one of "
            f"{', '.join(map(repr, KEY_MODES))} (ordered: enqueue order, a retry keeps its "
            "place; exclusive: only never two at once)"
        )
    tenant = options.get("tenant_database")
    if tenant and extra.get("batch") is not None:
        raise ConfigurationError(
            f"batch_task {name!r}: tenant_database=True is for @app.task (a batch's jobs may "
            "belong to different tenants): open the tenants' databases in the handler instead"
        )
    return TaskDefinition(
        name=name,
        handler=for_tenants(handler, tenant),
        queue=options.get("queue"),
        priority=options.get("priority"),
        max_attempts=options.get("max_attempts"),
        backoff=backoff,
        key_mode=key_mode,
        coalesce=_check_coalesce(call, name, options.get("coalesce")),
        transaction=_check_transaction(call, name, options.get("transaction")),
        dead_handler=for_tenants(options.get("dead_handler"), tenant),
        **extra,
    )


def _check_coalesce(call: str, name: str, coalesce: Any) -> bool:
    if coalesce is not None and not isinstance(coalesce, bool):
        raise ConfigurationError(f"{call} {name!r}: coalesce={coalesce!r} must be True or False")
    return bool(coalesce)


def _check_transaction(call: str, name: str, transaction: Any) -> bool | None:
    if transaction is not None and not isinstance(transaction, bool):
        raise ConfigurationError(
            f"{call} {name!r}: transaction={transaction!r} must be True (the handler's writes "
            "commit with the job's completion) or False (it runs outside the claim's "
            "transaction, under a lease)"
        )
    return transaction


class HandlerRegistration:
    """The decorators of ``App``; the handlers land in the runtime context's registry, which
    the workers read."""

    def __init__(self, context: RuntimeContext) -> None:
        self.context = context

    def task(
        self,
        name: str | None = None,
        *,
        timeout: float | None = None,
        **options: Unpack[HandlerOptions],
    ) -> Callable[[H], H]:
        """Register ``handler(job, session)`` for a task name (default: the function's name).

        ``queue``, ``priority`` and ``max_attempts`` become the defaults for jobs enqueued with
        this task name; ``backoff`` (attempt → seconds) or ``retry_base_interval`` replace the
        App's retry delay for it; ``dead_handler`` runs once the job's attempts are exhausted.
        ``timeout``: seconds a run may take; past it the attempt fails with JobTimeoutError
        and is retried by the usual rules (overrides the worker's ``job_timeout``).
        ``tenant_database=True``: the handler (and ``dead_handler``) is called
        ``handler(job, session, tenant_session)``, ``tenant_session`` an ORM Session on the
        database of ``job.tenant`` (``App(tenant_databases=…)``), committed right before the
        job's completion commits, rolled back when the handler fails.
        """
        if callable(name):  # a bare @app.task: the function itself
            return self.task(None, timeout=timeout, **options)(name)  # type: ignore[return-value]
        _definition("task", name or "-", _no_handler, options)  # options checked now

        def register(handler: H) -> H:
            definition = _definition(
                "task", name or handler.__name__, handler, options, timeout=timeout
            )
            self.context.registry.register(definition)
            return handler

        return register

    def batch_task(
        self,
        name: str | None = None,
        *,
        max_size: int = 100,
        max_wait: float = 1.0,
        timeout: float | None = None,
        **options: Unpack[HandlerOptions],
    ) -> Callable[[H], H]:
        """Register ``handler(jobs, session)`` for a task whose jobs run in batches.

        A worker that claims a job of this task gathers up to ``max_size`` runnable jobs of it
        (same queue), waiting at most ``max_wait`` seconds after the first for more, and calls
        the handler once with the list. It may return a mapping of job id → exception to fail
        only those jobs; the others succeed, in the same transaction as the handler's writes.
        An exception raised fails every job of the batch (each by its own retry rules).
        ``timeout`` covers the whole call; the other options are those of ``task``.
        """
        if callable(name):  # a bare @app.batch_task: the function itself
            return self.batch_task(  # type: ignore[return-value]
                None, max_size=max_size, max_wait=max_wait, timeout=timeout, **options
            )(name)
        batch = _batch_options(max_size, max_wait)
        _definition("batch_task", name or "-", _no_handler, options)  # options checked now

        def register(handler: H) -> H:
            definition = _definition(
                "batch_task",
                name or handler.__name__,
                handler,
                options,
                timeout=timeout,
                batch=batch,
            )
            self.context.registry.register(definition)
            return handler

        return register

    # ---- middlewares and the workers' hooks ---------------------------------------------------
    def middleware(self, fn: M) -> M:
        """Run ``fn(job, call_next)`` around every handler (the first registered outermost);
        ``call_next()`` runs the rest and returns the handler's value. A batch handler's
        middlewares get the list of its jobs instead of one job."""
        return self.context.registry.hooks.add("middlewares", fn)  # type: ignore[no-any-return]

    def on_worker_start(self, fn: M) -> M:
        """Run ``fn(worker)`` in each worker once it is set up, before it claims anything; an
        exception stops the worker from starting."""
        return self.context.registry.hooks.add("on_start", fn)  # type: ignore[no-any-return]

    def on_worker_stop(self, fn: M) -> M:
        """Run ``fn(worker)`` when a worker that started stops, after its last job."""
        return self.context.registry.hooks.add("on_stop", fn)  # type: ignore[no-any-return]

    def on_worker_error(self, fn: M) -> M:
        """Run ``fn(exc, worker)`` for an error that escaped every handler: the worker loop's
        (database gone, a bug), a worker thread's, a start or stop hook's, a fatal one."""
        return self.context.registry.hooks.add("on_error", fn)  # type: ignore[no-any-return]

    def dead_handler(self, task: str, *, tenant_database: bool = False) -> Callable[[H], H]:
        """Register ``handler(job, session)`` to run on a task's dead-letter jobs
        (``job.dead`` is True and ``job.live_id`` is the id of the job that died);
        ``tenant_database=True``: ``handler(job, session, tenant_session)``, as for tasks."""

        def register(handler: H) -> H:
            self.context.registry.add_dead_handler(task, for_tenants(handler, tenant_database))
            return handler

        return register

    def subscriber(
        self, topic: str, subscription_id: str, **options: Unpack[HandlerOptions]
    ) -> Callable[[H], H]:
        """Register ``handler(job, session)`` for the deliveries of one subscription of a topic
        (``job.payload`` is the published payload; ``job.publication_id`` and
        ``job.subscription_id`` say which publication and subscription).

        The options are those of ``task``; ``queue``, ``priority`` and ``max_attempts`` apply to
        deliveries published through an App that has this registration.
        """
        _definition("subscriber", topic, _no_handler, options)  # options checked now
        check_subscription_id(subscription_id)
        if options.get("priority") is not None:
            _check_int("priority", options["priority"])
        if options.get("max_attempts") is not None:
            _check_int("max_attempts", options["max_attempts"], minimum=1)

        def register(handler: H) -> H:
            definition = _definition(
                "subscriber", topic, handler, options, subscription_id=subscription_id
            )
            self.context.registry.register_subscriber(definition)
            return handler

        return register

    def dead_subscriber(
        self, topic: str, subscription_id: str, *, tenant_database: bool = False
    ) -> Callable[[H], H]:
        """Register ``handler(job, session)`` for a subscription's deliveries whose attempts are
        exhausted (``job.dead`` is True, ``job.live_id`` is the delivery that died). A webhook
        subscription may have one too. ``tenant_database`` as for ``task``."""
        check_subscription_id(subscription_id)

        def register(handler: H) -> H:
            wrapped = for_tenants(handler, tenant_database)
            self.context.registry.add_dead_subscriber(topic, subscription_id, wrapped)
            return handler

        return register


def _batch_options(max_size: Any, max_wait: Any) -> BatchOptions:
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
        raise ConfigurationError(
            f"batch_task: max_size={max_size!r} must be a whole number of at least 1 (the most "
            "jobs one call of the handler gets)"
        )
    if isinstance(max_wait, bool) or not isinstance(max_wait, (int, float)) or max_wait < 0:
        raise ConfigurationError(
            f"batch_task: max_wait={max_wait!r} must be a number of seconds, 0 or more (how "
            "long a worker waits for more jobs after the first)"
        )
    return BatchOptions(max_size, float(max_wait))


def _no_handler(job: Any, session: Any) -> None:
    """Stands in for the handler while the options are checked, before the decorator runs."""

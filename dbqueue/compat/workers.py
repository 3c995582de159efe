"""The seed's workers (nsj-queue-lib's ``WorkerBase`` and ``WorkerPubSubBase``), thin layers
over ``dbqueue.App``.

``WorkerBase`` keeps ``execute(payload, job, session)`` / ``execute_dead`` and ``.run()``;
``WorkerPubSubBase`` keeps methods marked ``@Subscriber(id)`` / ``@DeadSubscriber(id)`` taking
``(payload, subscription, job, session)``. Both are configured by the seed's environment
variables, LOG_DEBUG included.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from dbqueue.app.facade import App
from dbqueue.base.identifiers import check_subscription_id
from dbqueue.base.results import Message
from dbqueue.config import Settings, seed_retries
from dbqueue.errors import AttemptFailed
from dbqueue.job import Job
from dbqueue.pubsub.subscriptions import Subscription
from dbqueue.tasks.registry import ANY_TOPIC, TaskDefinition, TenantHandler

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("dbqueue.compat")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextlib.contextmanager
def seed_logging(debug: bool) -> Iterator[None]:
    """The seed's workers printed their logs, at DEBUG when LOG_DEBUG is true: a worker run as
    a script logs to stderr (unless the application configured logging), and dbqueue's loggers
    go down to DEBUG for the run."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    logger = logging.getLogger("dbqueue")
    level = logger.level
    if debug:
        logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.setLevel(level)


def seed_app(**options: Any) -> App:
    """The App a seed class makes for itself: configured from the environment, with the seed's
    retry rule (100 attempts, 5 minutes × the attempt number) wherever nothing sets another."""
    return App(settings=seed_retries(Settings.from_env()), **options)


class _SeedWorker:
    """What both seed workers share: an App (by default from the environment) and ``run``."""

    def __init__(self, app: App | None = None, **worker_options: Any) -> None:
        self.app = app or seed_app()
        self.worker_options = worker_options

    def run(self, **options: Any) -> Any:
        """Run a worker until it stops; LOG_DEBUG=true logs dbqueue's debug lines."""
        with seed_logging(self.app.settings.log_debug):
            log.debug("%s: worker options %s", type(self).__name__, self.worker_options)
            return self.app.run_worker(**{**self.worker_options, **options})


class WorkerBase(_SeedWorker):
    """The seed's worker: subclass it, implement ``execute`` (and ``execute_dead`` if the dead
    queue needs more than a log line), then ``MyWorker().run()``.

    It handles every task on its queue (QUEUE_NAME, else 'default'); configuration comes from
    the environment like the seed's (DBQUEUE_URL or DB_HOST/DB_PORT/DB_BASE/DB_USER/DB_PASS,
    QUEUE_TABLE, QUEUE_MAX_RETRY, QUEUE_BASE_INTERVAL_RETRY, LOG_DEBUG, …). An ``execute`` /
    ``execute_dead`` that declares ``multi_db_conn`` (the seed's multi-database mode) gets an
    ORM Session on the job's tenant's database under that name (MULTI_DATABASE=true, or
    ``App(tenant_databases=…)``).
    """

    def __init__(self, app: App | None = None, **worker_options: Any) -> None:
        super().__init__(app, **worker_options)
        self.app.registry.catch_all = TaskDefinition(
            name="*",
            handler=_seed_handler(self.app, self.execute, self._run_execute),
            dead_handler=_seed_handler(self.app, self.execute_dead, self._run_execute_dead),
        )

    def execute(self, payload: Any, job: Job, session: Any) -> Any:
        """Process one task; a returned string becomes the job's message (the seed's
        ``mensagem``), any other value its result (JSON)."""
        raise TypeError(f"{type(self).__name__} must implement execute(payload, job, session)")

    def execute_dead(self, payload: Any, job: Job, session: Any) -> str | None:
        """Process a task whose attempts are exhausted; by default, log it."""
        log.warning(
            "dead task %s (%s), live job %s: payload %r", job.id, job.task, job.live_id, payload
        )
        return f"dead task of job {job.live_id} logged"

    def _run_execute(self, job: Job, session: Any, *tenant: Any) -> Any:
        return seed_outcome(self.execute(job.payload, job, session, **_multi_db(tenant)))

    def _run_execute_dead(self, job: Job, session: Any, *tenant: Any) -> Any:
        return seed_outcome(self.execute_dead(job.payload, job, session, **_multi_db(tenant)))


MULTI_DB_CONN = "multi_db_conn"


def takes_multi_db_conn(method: Callable[..., Any]) -> bool:
    """Whether a seed method declares the seed's ``multi_db_conn`` parameter (version 1.2's
    multi-database mode): it then gets an ORM Session on the job's tenant's database."""
    try:
        return MULTI_DB_CONN in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def _multi_db(tenant: tuple[Any, ...]) -> dict[str, Any]:
    return {MULTI_DB_CONN: tenant[0]} if tenant else {}


def _seed_handler(app: App, method: Callable[..., Any], runner: Callable[..., Any]) -> Any:
    """``runner`` registered as is, or, when ``method`` declares ``multi_db_conn``, as a
    handler taking the tenant's session (passed on as ``multi_db_conn``). Without tenant
    databases (MULTI_DATABASE unset, as in the seed) ``multi_db_conn`` is None."""
    if not takes_multi_db_conn(method):
        return runner
    if app.context.tenants is None:
        return lambda job, session: runner(job, session, None)
    return TenantHandler(lambda job, session, tenant: runner(job, session, tenant))


def seed_outcome(value: Any) -> Any:
    """The seed's methods return the text of the job's message: kept there, not as a result."""
    return Message(value) if isinstance(value, str) else value


_SUBSCRIBER = "_dbqueue_subscriber"
_DEAD_SUBSCRIBER = "_dbqueue_dead_subscriber"


def _marker(attribute: str, subscription_id: str) -> Callable[[F], F]:
    check_subscription_id(subscription_id)

    def mark(method: F) -> F:
        setattr(method, attribute, subscription_id)
        return method

    return mark


def Subscriber(subscription_id: str) -> Callable[[F], F]:  # noqa: N802 - the seed's name
    """Mark a WorkerPubSubBase method as the code for one subscription's deliveries."""
    return _marker(_SUBSCRIBER, subscription_id)


def DeadSubscriber(subscription_id: str) -> Callable[[F], F]:  # noqa: N802 - the seed's name
    """Mark a WorkerPubSubBase method as the code for a subscription's dead deliveries."""
    return _marker(_DEAD_SUBSCRIBER, subscription_id)


class WorkerPubSubBase(_SeedWorker):
    """The seed's pub/sub worker: subclass it and mark methods
    ``(self, payload, subscription, job, session)`` with ``@Subscriber("id")`` (and
    ``@DeadSubscriber("id")``), then ``MyWorker().run()``.

    A method serves its subscription's deliveries whatever their topic (subscription ids are
    unique). ``subscription`` is the subscription's row (``Subscription``, which also answers
    the seed's keys: ``subscription["processo"]``, ``["url"]``, …). Deliveries of subscriptions
    with a url and no method here are sent as webhooks. Configuration comes from the
    environment like ``WorkerBase``'s.
    """

    def __init__(self, app: App | None = None, **worker_options: Any) -> None:
        super().__init__(app, **worker_options)
        found = False
        for name in dir(type(self)):
            method = getattr(type(self), name, None)
            live = getattr(method, _SUBSCRIBER, None)
            dead = getattr(method, _DEAD_SUBSCRIBER, None)
            if live is not None:
                self.app.registry.register_subscriber(
                    TaskDefinition(
                        name=ANY_TOPIC,
                        handler=self._adapter(getattr(self, name)),
                        subscription_id=live,
                    )
                )
                found = True
            if dead is not None:
                handler = self._adapter(getattr(self, name))
                self.app.registry.add_dead_subscriber(ANY_TOPIC, dead, handler)
                found = True
        if not found:
            log.warning(
                "%s has no method marked @Subscriber(id): only webhook deliveries will run",
                type(self).__name__,
            )

    def _adapter(self, method: Callable[..., Any]) -> Any:
        """``handler(job, session)`` calling the seed-style ``method(payload, subscription,
        job, session)`` (``handler(job, session, tenant_session)`` when the method declares
        ``multi_db_conn``)."""

        def handler(job: Job, session: Any, *tenant: Any) -> Any:
            subscription = self._subscription(job, session)
            return seed_outcome(
                method(job.payload, subscription, job, session, **_multi_db(tenant))
            )

        handler.__qualname__ = getattr(method, "__qualname__", repr(method))
        handler.__module__ = getattr(method, "__module__", __name__)
        if not takes_multi_db_conn(method):
            return handler
        if self.app.context.tenants is None:  # not in multi-database mode: None, as the seed
            return lambda job, session: handler(job, session, None)
        return TenantHandler(handler)

    def _subscription(self, job: Job, session: Any) -> Subscription:
        assert job.subscription_id is not None
        found = self.app.get_subscription(job.subscription_id, target=session)
        if found is None:
            raise AttemptFailed(
                f"subscription {job.subscription_id!r} (topic {job.task!r}) no longer exists in "
                f"{self.app.names.subscriptions}: its code cannot be given its row"
            )
        return found

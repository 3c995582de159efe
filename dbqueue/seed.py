"""The seed library's names (nsj-queue-lib), for code ported from it.

``QueueClient(conn, queue_table)`` keeps ``insert_task`` / ``list_equivalent_task`` /
``insert_task_pub_sub`` / ``insert_task_webhook``; ``WorkerBase`` keeps
``execute(payload, job, session)`` / ``execute_dead`` and ``.run()``; ``WorkerPubSubBase``
keeps methods marked ``@Subscriber(id)`` / ``@DeadSubscriber(id)`` taking
``(payload, subscription, job, session)``. They are thin layers over ``dbqueue.App``.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from .app import App
from .client import Target
from .errors import AttemptFailed
from .identifiers import check_subscription_id
from .job import Job, Status
from .pubsub import Subscription
from .tasks import ANY_TOPIC, TaskDefinition

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("dbqueue.seed")

# The seed's Portuguese statuses, in dbqueue's words. dbqueue keeps one row per job, so a
# failed attempt ("falha") is a job waiting for its retry, and "agendada" is a waiting job.
SEED_STATUSES = {
    "agendada": Status.AVAILABLE,
    "pendente": Status.AVAILABLE,
    "falha": Status.AVAILABLE,
    "processando": Status.RUNNING,
    "sucesso": Status.SUCCEEDED,
    "morta": Status.DEAD,
}


def _options(
    origem: str | None,
    destino: str | None,
    chave_externa: str | None,
    tenant: int | None,
    grupo_empresarial: str | None,
    data_hora: dt.datetime | None,
    prioridade: int | None,
) -> dict[str, Any]:
    """The seed's insert arguments as enqueue/publish options."""
    return {
        "origin": origem,
        "destination": destino,
        "external_key": chave_externa,
        "tenant": tenant,
        "business_group": grupo_empresarial,
        "run_at": _aware(data_hora),
        "priority": prioridade,
    }


def _aware(value: dt.datetime | None) -> dt.datetime | None:
    """The seed passed naive local datetimes; read them as the machine's local time."""
    if value is None or value.tzinfo is not None:
        return value
    return value.astimezone()


class QueueClient:
    """The seed's client SDK. ``bd_conn`` is a Connection or ORM Session (the task joins its
    transaction) or an Engine; ``queue_table`` names the jobs table (default: the App's)."""

    def __init__(
        self,
        bd_conn: Target,
        queue_table: str | None = None,
        queue_subscriber_table: str | None = None,
        *,
        app: App | None = None,
    ) -> None:
        self.conn = bd_conn
        self.app = app or App(jobs_table=queue_table, subscriptions_table=queue_subscriber_table)

    def insert_task(
        self,
        origem: str | None,
        destino: str | None,
        processo: str,
        chave_externa: str | None,
        payload: Any,
        tenant: int | None = None,
        grupo_empresarial: str | None = None,
        data_hora: dt.datetime | None = None,
        prioridade: int | None = None,
    ) -> int:
        """Enqueue a simple task; returns the new job's id."""
        return self.app.enqueue(
            self.conn,
            processo,
            payload,
            **_options(
                origem, destino, chave_externa, tenant, grupo_empresarial, data_hora, prioridade
            ),
        )

    def insert_task_pub_sub(
        self,
        origem: str | None,
        destino: str | None,
        processo: str,
        chave_externa: str | None,
        payload: Any,
        tenant: int | None = None,
        grupo_empresarial: str | None = None,
        data_hora: dt.datetime | None = None,
        prioridade: int | None = None,
    ) -> int:
        """Publish to every active subscription of ``processo`` (one job each); returns the
        publication id."""
        return self.app.publish(
            self.conn,
            processo,
            payload,
            **_options(
                origem, destino, chave_externa, tenant, grupo_empresarial, data_hora, prioridade
            ),
        )

    def insert_task_webhook(
        self,
        origem: str | None,
        destino: str | None,
        processo: str,
        chave_externa: str | None,
        payload: Any,
        tenant: int | None = None,
        grupo_empresarial: str | None = None,
        data_hora: dt.datetime | None = None,
        prioridade: int | None = None,
    ) -> int:
        """Publish to the active webhook subscriptions (those with a url) of ``processo``;
        returns the publication id."""
        return self.app.publish_webhook(
            self.conn,
            processo,
            payload,
            **_options(
                origem, destino, chave_externa, tenant, grupo_empresarial, data_hora, prioridade
            ),
        )

    def list_equivalent_task(
        self,
        origem: str | None,
        destino: str | None,
        processo: str,
        chave_externa: str | None,
        payload: Any,
        tenant: int | None = None,
        grupo_empresarial: str | None = None,
        status: list[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Tasks already queued with the same process, payload, key, origin, destination,
        tenant and group, in the given seed statuses (default: sucesso, pendente, agendada)."""
        wanted = status or ["sucesso", "pendente", "agendada"]
        statuses = sorted({SEED_STATUSES.get(s, s) for s in wanted})
        return self.app.find_equivalent(
            self.conn,
            processo,
            payload,
            statuses=statuses,
            external_key=chave_externa,
            origin=origem,
            destination=destino,
            tenant=tenant,
            business_group=grupo_empresarial,
        )


class WorkerBase:
    """The seed's worker: subclass it, implement ``execute`` (and ``execute_dead`` if the dead
    queue needs more than a log line), then ``MyWorker().run()``.

    It handles every task on its queue (QUEUE_NAME, else 'default'); configuration comes from
    the environment like the seed's (DBQUEUE_URL or DB_HOST/DB_PORT/DB_BASE/DB_USER/DB_PASS,
    QUEUE_TABLE, QUEUE_MAX_RETRY, QUEUE_BASE_INTERVAL_RETRY, …).
    """

    def __init__(self, app: App | None = None, **worker_options: Any) -> None:
        self.app = app or App()
        self.worker_options = worker_options
        self.app.registry.catch_all = TaskDefinition(
            name="*", handler=self._run_execute, dead_handler=self._run_execute_dead
        )

    def execute(self, payload: Any, job: Job, session: Any) -> str | None:
        """Process one task; the return value becomes the job's message."""
        raise TypeError(f"{type(self).__name__} must implement execute(payload, job, session)")

    def execute_dead(self, payload: Any, job: Job, session: Any) -> str | None:
        """Process a task whose attempts are exhausted; by default, log it."""
        log.warning(
            "dead task %s (%s), live job %s: payload %r", job.id, job.task, job.live_id, payload
        )
        return f"dead task of job {job.live_id} logged"

    def _run_execute(self, job: Job, session: Any) -> str | None:
        return self.execute(job.payload, job, session)

    def _run_execute_dead(self, job: Job, session: Any) -> str | None:
        return self.execute_dead(job.payload, job, session)

    def run(self, **options: Any) -> Any:
        return self.app.run_worker(**{**self.worker_options, **options})


_SUBSCRIBER = "_dbqueue_subscriber"
_DEAD_SUBSCRIBER = "_dbqueue_dead_subscriber"


def Subscriber(subscription_id: str) -> Callable[[F], F]:  # noqa: N802 - the seed's name
    """Mark a WorkerPubSubBase method as the code for one subscription's deliveries."""
    check_subscription_id(subscription_id)

    def mark(method: F) -> F:
        setattr(method, _SUBSCRIBER, subscription_id)
        return method

    return mark


def DeadSubscriber(subscription_id: str) -> Callable[[F], F]:  # noqa: N802 - the seed's name
    """Mark a WorkerPubSubBase method as the code for a subscription's dead deliveries."""
    check_subscription_id(subscription_id)

    def mark(method: F) -> F:
        setattr(method, _DEAD_SUBSCRIBER, subscription_id)
        return method

    return mark


class WorkerPubSubBase:
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
        self.app = app or App()
        self.worker_options = worker_options
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

    def _adapter(self, method: Callable[..., Any]) -> Callable[[Job, Any], Any]:
        """``handler(job, session)`` calling the seed-style ``method(payload, subscription,
        job, session)``."""

        def handler(job: Job, session: Any) -> Any:
            subscription = self._subscription(job, session)
            return method(job.payload, subscription, job, session)

        handler.__qualname__ = getattr(method, "__qualname__", repr(method))
        handler.__module__ = getattr(method, "__module__", __name__)
        return handler

    def _subscription(self, job: Job, session: Any) -> Subscription:
        assert job.subscription_id is not None
        found = self.app.subscription_store.get(session.connection(), job.subscription_id)
        if found is None:
            raise AttemptFailed(
                f"subscription {job.subscription_id!r} (topic {job.task!r}) no longer exists in "
                f"{self.app.names.subscriptions}: its code cannot be given its row"
            )
        return found

    def run(self, **options: Any) -> Any:
        return self.app.run_worker(**{**self.worker_options, **options})

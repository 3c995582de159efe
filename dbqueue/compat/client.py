"""The seed's client SDK (nsj-queue-lib's ``QueueClient``), a thin layer over ``dbqueue.App``.

``QueueClient(conn, queue_table)`` keeps ``insert_task`` / ``list_equivalent_task`` /
``insert_task_pub_sub`` / ``insert_task_webhook``, the seed's Portuguese argument names and, in
the App it makes unless given one, the seed's retry rule.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from dbqueue.app.facade import App
from dbqueue.compat.keys import SEED_STATUSES
from dbqueue.compat.workers import seed_app
from dbqueue.runtime.targets import Target


def _aware(value: dt.datetime | None) -> dt.datetime | None:
    """The seed passed naive local datetimes; read them as the machine's local time."""
    if value is None or value.tzinfo is not None:
        return value
    return value.astimezone()


def _seed_insert(app_method: str, doc: str) -> Callable[..., int]:
    """One of the seed's three insert methods, with its positional Portuguese arguments:
    they differ only in the App call that writes the task."""

    def insert(
        self: QueueClient,
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
        return getattr(self.app, app_method)(
            self.conn,
            processo,
            payload,
            origin=origem,
            destination=destino,
            external_key=chave_externa,
            tenant=tenant,
            business_group=grupo_empresarial,
            run_at=_aware(data_hora),
            priority=prioridade,
        )

    insert.__doc__ = doc
    return insert


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
        self.app = app or seed_app(
            jobs_table=queue_table, subscriptions_table=queue_subscriber_table
        )

    insert_task = _seed_insert("enqueue", "Enqueue a simple task; returns the new job's id.")
    insert_task_pub_sub = _seed_insert(
        "publish",
        "Publish to every active subscription of ``processo`` (one job each); returns the "
        "publication id.",
    )
    insert_task_webhook = _seed_insert(
        "publish_webhook",
        "Publish to the active webhook subscriptions (those with a url) of ``processo``; "
        "returns the publication id.",
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
        statuses = sorted({found for s in wanted for found in SEED_STATUSES.get(s, (s,))})
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

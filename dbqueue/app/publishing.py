"""Publishing on a topic: one publication row, and one delivery job per matching subscription."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from dbqueue.base.identifiers import check_task_name
from dbqueue.engine import NewJob
from dbqueue.job import PUBLICATION_MARKER
from dbqueue.pubsub.subscriptions import publication_message
from dbqueue.runtime.enqueue import build_job
from dbqueue.schema.tables import DEFAULT_PRIORITY

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext

#: Options that, when the caller leaves them out, come from each subscriber's registration.
SUBSCRIBER_OPTIONS = ("queue", "priority", "max_attempts")


@dataclass(frozen=True)
class Publication:
    """A validated, encoded publication, before anything touches the database."""

    topic: str
    template: NewJob
    explicit: Mapping[str, Any]
    webhooks_only: bool


def prepare(
    context: RuntimeContext,
    topic: str,
    payload: Any,
    options: Mapping[str, Any],
    webhooks_only: bool,
) -> Publication:
    check_task_name(topic)
    explicit = {name: options.get(name) for name in SUBSCRIBER_OPTIONS}
    others = {k: v for k, v in options.items() if k not in SUBSCRIBER_OPTIONS}
    template = build_job(
        topic,
        payload,
        queue=explicit["queue"] or context.default_queue,
        priority=DEFAULT_PRIORITY if explicit["priority"] is None else explicit["priority"],
        max_attempts=explicit["max_attempts"] or context.max_attempts,
        max_payload_bytes=context.max_payload_bytes,
        **others,
    )
    return Publication(topic, template, explicit, webhooks_only)


def publish(
    context: RuntimeContext,
    conn: Connection,
    publication: Publication,
    need_ids: bool = False,
) -> tuple[int, list[str], list[int]]:
    """Insert the publication and its deliveries on ``conn``; returns the publication id, the
    deliveries' queues (to wake once committed) and their ids (``need_ids``: on every
    database, see ``insert_many``)."""
    template, explicit = publication.template, publication.explicit
    topic, webhooks_only = publication.topic, publication.webhooks_only
    record = dataclasses.replace(
        template, delay=None, run_at=None, subscription_id=PUBLICATION_MARKER, key=None
    )
    reached = context.subscriptions.matching(
        conn, topic, template.tenant, template.business_group, webhooks_only
    )
    message = publication_message(
        topic, reached, template.tenant, template.business_group, webhooks_only
    )
    engine = context.queue_engine(conn)
    publication_id = engine.inserts.insert_finished(conn, record, message)
    deliveries = [
        _delivery(context, template, publication_id, subscription_id, explicit)
        for subscription_id in reached
    ]
    ids = engine.inserts.insert_many(conn, deliveries, need_ids=need_ids) if deliveries else []
    return publication_id, [delivery.queue for delivery in deliveries], ids


def _delivery(
    context: RuntimeContext,
    template: NewJob,
    publication_id: int,
    subscription_id: str,
    explicit: Mapping[str, Any],
) -> NewJob:
    """One subscription's job: explicit options, else its subscriber's, else the App's."""
    definition = context.registry.subscriber(template.task, subscription_id)
    changes: dict[str, Any] = {}
    if definition is not None:
        for option in SUBSCRIBER_OPTIONS:
            registered = getattr(definition, option)
            if explicit[option] is None and registered is not None:
                changes[option] = registered
    return dataclasses.replace(
        template, publication_id=publication_id, subscription_id=subscription_id, **changes
    )

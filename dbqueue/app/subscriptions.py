"""The App's calls on the subscriptions table: who receives the publications of a topic (the
statements are in ``dbqueue.pubsub.subscriptions``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dbqueue.app.targets import target_or_engine
from dbqueue.pubsub.subscriptions import Subscription, SubscriptionChanges, new_subscription_values
from dbqueue.runtime.targets import Target, connection_for, write_target

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext


class SubscriptionCalls:
    """Adds, finds, changes and removes subscriptions."""

    def __init__(self, context: RuntimeContext) -> None:
        self.context = context

    def add(
        self,
        target: Target | None,
        subscription_id: str,
        topic: str,
        tenant: int | None,
        business_group: str | None,
        url: str | None,
        method: str,
        headers: Mapping[str, Any] | None,
        active: bool,
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
            return self.context.subscriptions.add(conn, values)

    def find(
        self, topic: str | None, active: bool | None, target: Target | None
    ) -> list[Subscription]:
        """The subscriptions (of one topic; only the active or inactive ones), by topic and id."""
        with connection_for(target_or_engine(self.context, target)) as conn:
            return self.context.subscriptions.find(conn, topic, active)

    def get(self, subscription_id: str, target: Target | None = None) -> Subscription | None:
        """One subscription (None: there is no such subscription)."""
        with connection_for(target_or_engine(self.context, target)) as conn:
            return self.context.subscriptions.get(conn, subscription_id)

    def set_active(self, target: Target | None, subscription_id: str, active: bool) -> Subscription:
        """Enable or disable a subscription. A disabled one receives no publications, and its
        pending webhook deliveries wait, failing their attempts, until it is enabled again; it
        stays in the table."""
        with connection_for(self._write_target(target)) as conn:
            return self.context.subscriptions.set_active(conn, subscription_id, active)

    def update(
        self, target: Target | None, subscription_id: str, changes: SubscriptionChanges
    ) -> Subscription:
        """Change a subscription's topic, filters, webhook (url, method, headers) or active
        flag; None clears tenant, business_group, url and headers. Returns the new row."""
        with connection_for(self._write_target(target)) as conn:
            return self.context.subscriptions.update(conn, subscription_id, changes)

    def remove(self, target: Target | None, subscription_id: str) -> Subscription:
        """Delete a subscription; returns the row it was. Its pending deliveries stay: a
        webhook's fail their attempts (retried in case it is added back), code still runs."""
        with connection_for(self._write_target(target)) as conn:
            return self.context.subscriptions.remove(conn, subscription_id)

    def _write_target(self, target: Target | None) -> Target:
        return write_target(target_or_engine(self.context, target))

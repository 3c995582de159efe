"""The morgue (Lowkiq's name for the dead jobs): list, requeue and delete them, one by one or
by filter (the statements are in ``dbqueue.engine.queries``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dbqueue.app.targets import target_or_engine
from dbqueue.errors import ConfigurationError
from dbqueue.runtime.targets import Target, connection_for, write_target

if TYPE_CHECKING:
    from dbqueue.runtime.commit_wake import CommitWaker
    from dbqueue.runtime.context import RuntimeContext

#: ``order_by`` values of ``dead_jobs``: the newest death first, or the oldest job first.
MORGUE_ORDERS = ("finished_at", "id")


def check_order(order_by: str) -> str:
    if order_by not in MORGUE_ORDERS:
        raise ConfigurationError(
            f"order_by={order_by!r} is not a morgue order: use one of {', '.join(MORGUE_ORDERS)}"
        )
    return order_by


def _ids(ids: Sequence[int], call: str) -> list[int]:
    if isinstance(ids, (int, str)):
        raise ConfigurationError(f"{call}: ids must be a list of job ids, e.g. [{ids}]")
    values = list(ids)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigurationError(f"{call}: {value!r} is not a job id (a whole number)")
    return values


class MorgueCalls:
    """Lists, requeues and deletes dead jobs."""

    def __init__(self, context: RuntimeContext, waker: CommitWaker) -> None:
        self.context = context
        #: Wakes the workers (of this process, and through the lock server) after a requeue.
        self._waker = waker

    def dead_jobs(
        self,
        queue: str | None = None,
        limit: int = 100,
        target: Target | None = None,
        *,
        task: str | None = None,
        order_by: str = "finished_at",
    ) -> list[dict[str, Any]]:
        """Dead jobs (every column), of one ``queue`` / ``task`` when given, at most
        ``limit``: ``order_by="finished_at"`` lists the newest death first, ``"id"`` the
        oldest job first."""
        check_order(order_by)
        with connection_for(target_or_engine(self.context, target)) as conn:
            return self.context.queue_engine(conn).morgue.dead_jobs(
                conn, queue, limit, task=task, order_by=order_by
            )

    def requeue_dead(
        self,
        ids: Sequence[int] | None = None,
        target: Target | None = None,
        *,
        task: str | None = None,
        queue: str | None = None,
    ) -> list[int]:
        """Run dead jobs again from attempt 1; returns the ids that were dead and are
        requeued, sorted. ``ids``: those jobs (the others are left alone); ``ids=None``: every
        dead job of ``task`` and ``queue`` (each None: any), in one transaction."""
        return self._morgue_action("requeue_dead", ids, target, task, queue)

    def delete_dead(
        self,
        ids: Sequence[int] | None = None,
        target: Target | None = None,
        *,
        task: str | None = None,
        queue: str | None = None,
    ) -> list[int]:
        """Delete dead jobs for good; returns the ids deleted, sorted. ``ids`` and the
        filters as in ``requeue_dead``; jobs that are not dead are never deleted."""
        return self._morgue_action("delete_dead", ids, target, task, queue)

    def _morgue_action(
        self,
        action: str,
        ids: Sequence[int] | None,
        target: Target | None,
        task: str | None,
        queue: str | None,
    ) -> list[int]:
        if ids is not None and (task is not None or queue is not None):
            raise ConfigurationError(
                f"{action}: give job ids or a task/queue filter, not both (ids=None with the "
                "filter acts on every dead job it matches)"
            )
        chosen = None if ids is None else _ids(ids, action)
        queues: list[str] = []
        with connection_for(write_target(target_or_engine(self.context, target))) as conn:
            engine = self.context.queue_engine(conn)
            if chosen is None:
                chosen = engine.morgue.dead_ids(conn, queue, task)
            done: list[int] = getattr(engine.morgue, action)(conn, chosen) if chosen else []
            if done and action == "requeue_dead":
                queues = engine.morgue.announce_requeued(conn, done)
        if queues:  # due now: idle workers look at once, not at their next poll
            self._waker.after_commit(target, queues)
        return done

"""Declaring queues on an App: ``app.queue(name, concurrency=N)``.

A limit lands in the registry the runtime context shares with every App ``reconfigured`` from
this one, so workers built from the App (``app.run_worker``, ``dbqueue worker --app``) enforce it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dbqueue.base.identifiers import check_queue_name
from dbqueue.base.limits import check_queue_limit

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext


class QueueDeclarations:
    """The queues declared with a concurrency limit."""

    def __init__(self, context: RuntimeContext) -> None:
        self.context = context

    def queue(self, name: str, *, concurrency: int | None = None) -> str:
        """Declare queue ``name``; returns the name (for ``@app.task(queue=...)``).

        ``concurrency=N``: at most N jobs of the queue run at once across all workers and
        processes of this App's tables (1: an exclusive queue). A worker consumes the declared
        queues by default, takes one of the queue's N slots for each job it runs from it, and
        goes on with its other queues while all slots are taken. ``None`` removes the limit.
        """
        check_queue_name(name)
        limits = self.context.registry.queue_limits
        if concurrency is None:
            limits.pop(name, None)
        else:
            limits[name] = check_queue_limit(name, concurrency)
        return name

    @property
    def queue_limits(self) -> dict[str, int]:
        """The declared limits, queue → N (a copy)."""
        return dict(self.context.registry.queue_limits)

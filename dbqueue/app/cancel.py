"""``app.cancel`` and ``app.cancel_publication``: the App's cancellation calls (the steps are in
``dbqueue.runtime.cancellation``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from dbqueue.app.targets import target_or_engine
from dbqueue.runtime import cancellation
from dbqueue.runtime.targets import Target, connection_for, write_target

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext


class Cancellation:
    """Cancels jobs, by id or by publication."""

    def __init__(self, context: RuntimeContext) -> None:
        self.context = context

    def cancel(self, ids: int | Iterable[int], target: Target | None = None) -> dict[int, str]:
        """Cancel jobs; returns job id → ``"cancelled"``, ``"cancel requested"``,
        ``"already succeeded"`` / ``"already dead"`` / ``"already cancelled"`` or
        ``"not found"``, in the order given.

        A job waiting to run (due or scheduled) is ``cancelled`` at once: with a Session or
        Connection ``target``, in its transaction (rolled back, nothing changes). A running job
        gets a request, which its handler sees as ``job.cancel_requested()`` and its worker
        enforces like a timeout, within about a second; the job then ends ``cancelled`` (its
        writes rolled back, not retried, no dead handler). A finished job is left as it is.
        This call never waits for a running job's row lock.
        """
        call = cancellation.CancelCall(self.context, cancellation.job_ids(ids))
        if not call.ids:
            return {}
        if call.store.separate:
            call.post_early(self.context.engine)
        try:
            with connection_for(write_target(target_or_engine(self.context, target))) as conn:
                report = call.run(conn)
        except BaseException:
            call.withdraw()
            raise
        call.settle()
        return report

    def cancel_publication(
        self, publication_id: int, target: Target | None = None
    ) -> dict[int, str]:
        """Cancel every delivery of one publication (and their dead-letter jobs), as
        ``cancel`` does; returns the same report for each (empty: no such publication, or it
        reached no subscription)."""
        (publication_id,) = cancellation.job_ids(publication_id)
        with connection_for(target_or_engine(self.context, target)) as conn:
            ids = self.context.queue_engine(conn).queries.publication_jobs(conn, publication_id)
        return self.cancel(ids, target) if ids else {}

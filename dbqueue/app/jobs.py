"""Reading jobs by id, and finding the jobs that already carry a piece of work."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dbqueue.app.running import of_rows
from dbqueue.app.targets import target_or_engine
from dbqueue.base import payload as payload_codec
from dbqueue.job import Status
from dbqueue.runtime.targets import Target, connection_for

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext

#: The default of ``find_equivalent``'s column filters: "do not filter on this column" (None
#: means "the column is empty").
UNFILTERED: Any = object()


class JobLookup:
    """One job's row, and the jobs equivalent to one about to be enqueued."""

    def __init__(self, context: RuntimeContext) -> None:
        self.context = context

    def get_job(self, job_id: int, target: Target | None = None) -> dict[str, Any] | None:
        """One job row as a dict (None if there is no such job)."""
        with connection_for(target_or_engine(self.context, target)) as conn:
            return self.context.queue_engine(conn).queries.get(conn, job_id)

    def find_equivalent(
        self,
        target: Target | None,
        task: str,
        payload: Any,
        statuses: Sequence[str],
        queue: str | None,
        external_key: str | None,
        origin: str | None,
        destination: str | None,
        tenant: int | None,
        business_group: str | None,
    ) -> list[dict[str, Any]]:
        """Jobs of ``task`` with the same payload (by hash) in one of ``statuses`` (the App's
        default: waiting or running) — to avoid enqueueing the same work twice. The column
        filters narrow the match (UNFILTERED: any value; None: the column must be empty).
        A job a live worker runs inside its claim's transaction is ``running`` here (status
        and attempt), as in ``stats``, whatever its row says."""
        encoded = payload_codec.encode(payload, max_bytes=None)
        filters = {
            column: value
            for column, value in (
                ("queue", queue),
                ("external_key", external_key),
                ("origin", origin),
                ("destination", destination),
                ("tenant", tenant),
                ("business_group", business_group),
            )
            if value is not UNFILTERED
        }
        wanted = set(statuses)
        asked = wanted | {Status.AVAILABLE} if Status.RUNNING in wanted else wanted
        with connection_for(target_or_engine(self.context, target)) as conn:
            rows = self.context.queue_engine(conn).queries.find_equivalent(
                conn, task, encoded, sorted(asked), filters
            )
            runs = of_rows(self.context, conn, rows)
        found = [runs[row["id"]].on(row) if row["id"] in runs else row for row in rows]
        return [row for row in found if row["status"] in wanted]

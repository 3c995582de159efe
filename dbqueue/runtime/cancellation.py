"""Cancelling jobs without ever waiting for a running job: ``app.cancel`` and the steps of one
call (where requests are kept: ``engine/cancels.py``).

A waiting job (available, due or scheduled) is cancelled at once, in the caller's transaction.
A running job cannot be: its row may be locked by the batch running it for as long as its
handler runs (``skip_locked`` claims hold it in the batch transaction), so the call leaves a
request in the requests table instead, which the worker running the job polls (its cancel
poller, in ``worker/watchdog.py``, which then stops the job like a timeout). Where the database
has a single write lock that the running batch holds (SQLite), even that table cannot be
written while the job runs: requests then go to a side database
(``Dialect.side_database_url``), written before the caller's transaction waits for the lock —
which the stopped job's batch then releases.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine

from dbqueue.errors import ConfigurationError
from dbqueue.job import Status
from dbqueue.runtime.targets import Target, connection_for, write_target

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext

#: What ``app.cancel`` reports per job id.
CANCELLED = "cancelled"
REQUESTED = "cancel requested"
NOT_FOUND = "not found"


def already(status: str) -> str:
    """The report for a job that had finished: ``already succeeded`` / ``dead`` / ``cancelled``."""
    return f"already {status}"


def job_ids(ids: int | Iterable[int]) -> list[int]:
    """One id or an iterable of them, checked: whole numbers, in order, without repeats."""
    single = isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable)
    found: list[Any] = [ids] if single else list(ids)
    for job_id in found:
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
            raise ConfigurationError(
                f"job id {job_id!r} is not a job id: pass a whole number above 0, or a list of them"
            )
    return list(dict.fromkeys(found))


def forget_ended(context: RuntimeContext, conn: Connection, limit: int = 1000) -> int:
    """Delete the requests of jobs that ended (or were purged) before a worker saw them: the
    purge routine's clean-up. Returns how many jobs' requests went."""
    store = context.cancel_requests()
    ids = store.listed(conn, limit)
    states = context.queue_engine(conn).queries.job_states(conn, ids)
    ended = [job_id for job_id in ids if states.get(job_id) not in Status.PENDING]
    store.drop(conn, ended)
    return len(ended)


# ---- one app.cancel call ----------------------------------------------------------------------
class CancelCall:
    """The steps of cancelling ``ids``: ``post_early`` (only where requests are kept apart:
    before the caller's transaction waits for the write lock), ``run`` on the caller's
    connection, then ``settle``."""

    def __init__(self, context: RuntimeContext, ids: Sequence[int]) -> None:
        self.context = context
        self.ids = list(ids)
        self.store = context.cancel_requests()
        self.before: dict[int, str] | None = None
        self.early: set[int] = set()
        self._settled: list[int] = []

    def post_early(self, engine: Engine) -> None:
        """Read the jobs' states without waiting for anything, and ask every worker to stop
        any of them it runs: on a single-writer database a running job cannot be told apart
        from a waiting one, and the write lock the caller needs is held by its batch."""
        with engine.connect() as conn:
            self.before = self.context.queue_engine(conn).queries.job_states(conn, self.ids)
        self.early = {i for i in self.ids if self.before.get(i) in Status.PENDING}
        self.store.add(None, sorted(self.early))

    def run(self, conn: Connection) -> dict[int, str]:
        """Cancel the waiting jobs and ask for the running ones, on ``conn`` (the caller's
        transaction); returns job id → what happened."""
        engine = self.context.queue_engine(conn)
        before = (
            self.before if self.before is not None else engine.queries.job_states(conn, self.ids)
        )
        waiting = [i for i in self.ids if before.get(i) in Status.WAITING]
        cancelled = set(engine.cancels.cancel_waiting(conn, waiting, held=self._being_stopped))
        after = engine.queries.job_states(conn, [i for i in self.ids if i not in cancelled])
        report: dict[int, str] = {}
        running: list[int] = []
        for job_id in self.ids:
            status = after.get(job_id)
            if job_id in cancelled or (status == Status.CANCELLED and job_id in self.early):
                report[job_id] = CANCELLED  # (or its worker stopped it on the early request)
            elif status is None:
                report[job_id] = NOT_FOUND
            elif status in Status.PENDING:
                # Held by a claim (skip_locked shows it available) or marked running.
                report[job_id] = REQUESTED
                running.append(job_id)
            else:
                report[job_id] = already(status)
        ended = [i for i in self.ids if i not in running]
        if self.store.separate:
            self._settled = ended
        else:
            self.store.add(conn, running)
            self.store.drop(conn, ended)  # requests left by earlier calls for jobs now over
        return report

    def _being_stopped(self, ids: list[int]) -> set[int]:
        """Asked with the write lock held: which of ``ids`` a worker has taken the early
        request of (it stopped them; their batch rolled back; it records their end)."""
        return self.store.consume_taken([i for i in ids if i in self.early])

    def settle(self) -> None:
        """Withdraw the early requests of jobs that were not running after all."""
        if self._settled:
            self.store.drop(None, self._settled)

    def withdraw(self) -> None:
        """The call failed: withdraw its early requests (best effort; a worker may have seen
        one already)."""
        if self.early:
            self.store.drop(None, sorted(self.early))


class Cancellation:
    """``app.cancel`` and ``app.cancel_publication``: cancels jobs, by id or by publication."""

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
        call = CancelCall(self.context, job_ids(ids))
        if not call.ids:
            return {}
        if call.store.separate:
            call.post_early(self.context.engine)
        try:
            with connection_for(write_target(self._target(target))) as conn:
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
        (publication_id,) = job_ids(publication_id)
        with connection_for(self._target(target)) as conn:
            ids = self.context.queue_engine(conn).queries.publication_jobs(conn, publication_id)
        return self.cancel(ids, target) if ids else {}

    def _target(self, target: Target | None) -> Target:
        return self.context.engine if target is None else target

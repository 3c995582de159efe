"""The client calls that create jobs (enqueue, enqueue_many, publish), written once for the sync
and the async API: each call is validated and encoded into a ``Write`` before any I/O, and the
``Write`` runs on a sync Connection. The sync API runs it directly; the async API runs the very
same function on an AsyncConnection's ``run_sync`` (SQLAlchemy's greenlet bridge: the asyncio
driver does the I/O), so statements, checks and errors cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from . import publishing
from .client import Target, check_option_names, connection_for, job_for_task, write_target
from .errors import ConfigurationError

if TYPE_CHECKING:
    from .runtime import RuntimeContext


@dataclass(frozen=True)
class Written:
    """What a write did: the call's return value, and the jobs to wake workers for."""

    value: Any
    queues: Sequence[str] = ()
    ids: Sequence[int] = ()


@dataclass(frozen=True)
class Write:
    """One call's database work, already validated: ``run`` executes it on a Connection inside
    the caller's transaction. ``reads_first``: it reads before it writes (a publication reads
    the subscriptions), so dbqueue's own transaction takes its write lock first (SQLite)."""

    run: Callable[[Connection], Written] = field(repr=False)
    reads_first: bool = False

    @property
    def is_empty(self) -> bool:
        """Nothing to write (``enqueue_many`` of no jobs): no connection is taken."""
        return self.run is _nothing


def _nothing(conn: Connection) -> Written:
    return Written([])


class ClientWrites:
    """Builds the Writes of the job-creating calls and runs them synchronously; the App
    provides ``context``, ``_target``, ``_enqueued`` and ``eager``."""

    context: RuntimeContext
    _target: Callable[[Target | None], Target]
    _enqueued: Callable[[Target | None, Sequence[str], Sequence[int]], None]
    eager: bool

    def _enqueue_write(
        self, call: str, task: str, payload: Any, options: Mapping[str, Any]
    ) -> Write:
        check_option_names(call, options)
        job = job_for_task(self.context, task, payload, options)

        def run(conn: Connection) -> Written:
            job_id = self.context.queue_engine(conn).insert(conn, job)
            return Written(job_id, [job.queue], [job_id])

        return Write(run)

    def _enqueue_many_write(self, call: str, jobs: Iterable[Mapping[str, Any]]) -> Write:
        """All items are validated before anything touches the database."""
        built = []
        for index, spec in enumerate(jobs):
            options = dict(spec)
            try:
                task = options.pop("task")
            except KeyError:
                raise ConfigurationError(f"{call}: item {index} has no 'task'") from None
            payload = options.pop("payload", None)
            check_option_names(call, options)
            built.append(job_for_task(self.context, task, payload, options))
        if not built:
            return Write(_nothing)
        need_ids = self.eager

        def run(conn: Connection) -> Written:
            ids = self.context.queue_engine(conn).insert_many(conn, built, need_ids=need_ids)
            return Written(ids, [job.queue for job in built], ids)

        return Write(run)

    def _publish_write(
        self,
        call: str,
        topic: str,
        payload: Any,
        options: Mapping[str, Any],
        webhooks_only: bool,
    ) -> Write:
        check_option_names(call, options)
        publication = publishing.prepare(self.context, topic, payload, options, webhooks_only)
        need_ids = self.eager

        def run(conn: Connection) -> Written:
            publication_id, queues, ids = publishing.publish(
                self.context, conn, publication, need_ids=need_ids
            )
            return Written(publication_id, queues, ids)

        return Write(run, reads_first=True)

    def _write(self, target: Target | None, write: Write) -> Any:
        """Run ``write`` in ``target``'s transaction (or a short one of dbqueue's own); once
        that commits, wake the workers (or, eager, run the jobs)."""
        if write.is_empty:
            return []
        where = self._target(target)
        with connection_for(write_target(where) if write.reads_first else where) as conn:
            done = write.run(conn)
        if done.queues:
            self._enqueued(target, done.queues, done.ids)
        return done.value

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

from sqlalchemy.engine import Connection, Engine

from dbqueue.app import publishing
from dbqueue.engine import ALWAYS
from dbqueue.errors import ConfigurationError
from dbqueue.runtime.enqueue import (
    PLAIN_ITEM,
    check_no_unique,
    check_option_names,
    insert_job,
    job_for_task,
    plain_rows,
)
from dbqueue.runtime.targets import Target, connection_for, write_target

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext


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
    the subscriptions), so dbqueue's own transaction takes its write lock first (SQLite).
    ``one_statement``: it is one INSERT, which dbqueue's own transaction may commit on its own
    where the driver can (``Dialect.one_statement_transaction``: no BEGIN or COMMIT sent)."""

    run: Callable[[Connection], Written] = field(repr=False)
    reads_first: bool = False
    one_statement: bool = False

    @property
    def is_empty(self) -> bool:
        """Nothing to write (``enqueue_many`` of no jobs): no connection is taken."""
        return self.run is _nothing


def _nothing(conn: Connection) -> Written:
    return Written([])


_NO_OPTIONS: Mapping[str, Any] = {}


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
            job_id = insert_job(self.context.queue_engine(conn), conn, job)
            return Written(job_id, [job.queue], [job_id])

        # A unique job reads its key's holder before it writes; a keyed one takes its place
        # in the key's line first.
        unique = job.unique_key is not None
        return Write(run, reads_first=unique, one_statement=not unique and job.key is None)

    def _enqueue_many_write(self, call: str, jobs: Iterable[Mapping[str, Any]]) -> Write:
        """All items are validated before anything touches the database."""
        items = jobs if isinstance(jobs, list) else list(jobs)
        flat = plain_rows(self.context, items)
        if flat is not None:  # no item sets an option: the rows as one flat list
            return self._plain_many_write(flat) if flat else Write(_nothing)
        built = []
        context = self.context
        for index, spec in enumerate(items):
            if spec.keys() <= PLAIN_ITEM and "task" in spec:  # no options: no copy to pop from
                built.append(job_for_task(context, spec["task"], spec.get("payload"), _NO_OPTIONS))
                continue
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
        unique = any(job.unique_key is not None for job in built)

        def run(conn: Connection) -> Written:
            engine = self.context.queue_engine(conn)
            if unique:  # each one decides against its key's holder: one at a time
                ids = [insert_job(engine, conn, job) for job in built]
            else:
                ids = engine.inserts.insert_many(conn, built, need_ids=need_ids)
            return Written(ids, [job.queue for job in built], ids)

        return Write(run, reads_first=unique)

    def _plain_many_write(self, flat: list[Any]) -> Write:
        need_ids = self.eager

        def run(conn: Connection) -> Written:
            ids = self.context.queue_engine(conn).inserts.insert_plain(
                conn, flat, need_ids=need_ids
            )
            return Written(ids, flat[1 :: len(ALWAYS)], ids)

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
        check_no_unique(call, options)
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
        if type(where) is Connection:  # the caller's transaction as it is: no context manager
            done = write.run(where)
        elif write.one_statement and type(where) is Engine:
            with where.connect() as conn:
                dialect = self.context.queue_engine(conn).dialect
                with dialect.one_statement_transaction(conn):
                    done = write.run(conn)
        else:
            with connection_for(write_target(where) if write.reads_first else where) as conn:
                done = write.run(conn)
        if done.queues:
            self._enqueued(target, done.queues, done.ids)
        return done.value

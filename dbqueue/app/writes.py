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
from dbqueue.app.targets import target_or_engine
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
    from dbqueue.app.eager import AfterCommit
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
    """The job-creating calls: each builds its Write (the async calls await the same ones) and
    runs it; ``after_commit`` wakes the workers, or runs the jobs in eager mode."""

    def __init__(self, context: RuntimeContext, after_commit: AfterCommit) -> None:
        self.context = context
        self._after_commit = after_commit

    def enqueue(
        self, target: Target | None, task: str, payload: Any, options: Mapping[str, Any]
    ) -> int:
        """Insert one job in ``target``'s transaction and return its id.

        ``target`` is an ORM Session or a Connection (the job commits or rolls back with the
        caller's work) or an Engine/None (dbqueue commits at once). Lower priority runs first.
        The options (``EnqueueOptions``): queue, priority, delay, run_at, max_attempts,
        external_key, origin, destination, tenant, business_group, unique_key, on_conflict.
        With a ``unique_key`` the id returned is that of the job carrying this enqueue, which
        may be one enqueued before (see the README's "Unique jobs").
        """
        return self.execute(target, self.enqueue_write("enqueue", task, payload, options))

    def enqueue_many(self, target: Target | None, jobs: Iterable[Mapping[str, Any]]) -> list[int]:
        """Insert many jobs with multi-row statements (see the README); each item is a dict of
        ``enqueue``'s arguments (``task`` required, ``payload`` and the options optional). All
        are validated first."""
        return self.execute(target, self.enqueue_many_write("enqueue_many", jobs))

    def publish(
        self, target: Target | None, topic: str, payload: Any, options: Mapping[str, Any]
    ) -> int:
        """Publish ``payload`` on ``topic`` in ``target``'s transaction; return the
        publication id.

        Every active subscription of the topic whose tenant and business group filters match
        (a filter left empty matches everything) gets its own job — a delivery with its own
        status, attempts and retries. The publication itself is recorded as a finished row
        (id = the publication id) whose message lists the subscriptions reached, or says that
        none matched. ``queue``, ``priority`` and ``max_attempts`` apply to every delivery,
        else each subscriber's registered options, else the App's defaults.
        """
        write = self.publish_write("publish", topic, payload, options, webhooks_only=False)
        return self.execute(target, write)

    def publish_webhook(
        self, target: Target | None, topic: str, payload: Any, options: Mapping[str, Any]
    ) -> int:
        """Like ``publish``, but only subscriptions with a webhook url receive it (the seed's
        ``insert_task_webhook``)."""
        write = self.publish_write("publish_webhook", topic, payload, options, webhooks_only=True)
        return self.execute(target, write)

    def enqueue_write(
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

    def enqueue_many_write(self, call: str, jobs: Iterable[Mapping[str, Any]]) -> Write:
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
        need_ids = self._after_commit.eager
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
        need_ids = self._after_commit.eager

        def run(conn: Connection) -> Written:
            ids = self.context.queue_engine(conn).inserts.insert_plain(
                conn, flat, need_ids=need_ids
            )
            return Written(ids, flat[1 :: len(ALWAYS)], ids)

        return Write(run)

    def publish_write(
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
        need_ids = self._after_commit.eager

        def run(conn: Connection) -> Written:
            publication_id, queues, ids = publishing.publish(
                self.context, conn, publication, need_ids=need_ids
            )
            return Written(publication_id, queues, ids)

        return Write(run, reads_first=True)

    def execute(self, target: Target | None, write: Write) -> Any:
        """Run ``write`` in ``target``'s transaction (or a short one of dbqueue's own); once
        that commits, wake the workers (or, eager, run the jobs)."""
        if write.is_empty:
            return []
        where = target_or_engine(self.context, target)
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
            self._after_commit.enqueued(target, done.queues, done.ids)
        return done.value

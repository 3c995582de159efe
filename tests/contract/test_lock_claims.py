"""Lock-based claims (advisory_lock, lock_server), on every database that has them: a claim
holds the locks of exactly the jobs it returns, and a batch's locks are all given up once its
outcome has committed. A lock left behind would hide a runnable job from every other worker
(or, on a dead worker's job, keep rescue away) for as long as the connection lives."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from support.backends import backend_keys, effects

from dbqueue.strategies.locks import job_lock_name
from dbqueue.worker.executor import BatchExecutor
from dbqueue.worker.loop import claim_and_run

LOCK_BACKENDS = backend_keys(lambda spec: spec.commits_claims)
#: Database locks: their claims name the jobs' locks in SQL (a lock server's are named in its
#: messages, by ``job_lock_name``, so there is no second naming to keep equal).
DATABASE_LOCK_BACKENDS = backend_keys(lambda spec: spec.claims_under_database_locks)


@pytest.fixture
def setup(backend) -> Iterator[tuple[Any, Any, sa.Engine, list[int]]]:
    app = backend.app()
    app.task("noop")(lambda job, session: None)
    context = app.context.reconfigured(strategy=backend.strategy)
    engine = context.create_engine()
    app.enqueue_many(engine, [{"task": "noop", "payload": {"n": i}} for i in range(30)])
    strategy = context.open_strategy(context.check_database(engine))
    with engine.connect() as conn:  # (enqueue_many returns no ids where there is no RETURNING)
        jobs = context.queue_engine(conn).jobs
        ids = sorted(conn.execute(sa.select(jobs.c.id)).scalars())
    try:
        yield context, strategy, engine, ids
    finally:
        strategy.close()
        engine.dispose()


def _free(strategy: Any, conn: sa.Connection, engine: Any, ids: list[int]) -> list[bool]:
    """Whether each job's lock is free (taken and at once given back, from ``conn``)."""
    names = [job_lock_name(engine.tables.names.qualified_jobs, job_id) for job_id in ids]
    taken = strategy.locks.try_acquire(conn, names)
    strategy.locks.release(conn, [name for name, ok in zip(names, taken, strict=True) if ok])
    return taken


@pytest.mark.parametrize("backend", LOCK_BACKENDS, indirect=True)
def test_a_claim_locks_exactly_the_jobs_it_returns(setup) -> None:
    context, strategy, engine, ids = setup
    with engine.connect() as a, engine.connect() as b, engine.connect() as other:
        queue_engine = context.queue_engine(a)
        namespace = queue_engine.tables.names.qualified_jobs
        # Another holder has two of the jobs the first claim would take: it takes the others.
        held = [job_lock_name(namespace, ids[2]), job_lock_name(namespace, ids[5])]
        assert strategy.locks.try_acquire(other, held) == [True, True]
        first = strategy.claim(a, queue_engine.claims, "default", 10, "test:a")
        strategy.locks.release(other, held)
        second = strategy.claim(b, queue_engine.claims, "default", 30, "test:b")
        got_first, got_second = {job.id for job in first}, {job.id for job in second}
        assert got_first and ids[2] not in got_first and ids[5] not in got_first
        assert not got_first & got_second
        # Every job is claimed by one or the other: no lock was left on a job neither returned.
        assert got_first | got_second == set(ids)
        assert _free(strategy, other, queue_engine, ids) == [False] * len(ids)
        strategy.release(a, queue_engine.claims, first)
        strategy.release(b, queue_engine.claims, second)
        assert _free(strategy, other, queue_engine, ids) == [True] * len(ids)


@pytest.mark.parametrize("backend", LOCK_BACKENDS, indirect=True)
def test_a_batch_gives_up_every_lock_once_its_outcome_commits(setup) -> None:
    context, strategy, engine, ids = setup
    executor = BatchExecutor(context, strategy, "test:a")
    with engine.connect() as conn, engine.connect() as other:
        queue_engine = context.queue_engine(conn)

        def claim() -> list[Any]:
            return strategy.claim(conn, queue_engine.claims, "default", 10, "test:a")

        result = claim_and_run(executor, conn, queue_engine, claim, lambda: False)
        assert result is not None and result.succeeded == 10
        # The worker's connection is still open: its locks would still be held.
        assert _free(strategy, other, queue_engine, ids) == [True] * len(ids)
        with other.begin():
            done = other.execute(
                sa.select(sa.func.count())
                .select_from(queue_engine.jobs)
                .where(queue_engine.jobs.c.status == "succeeded")
            ).scalar_one()
        assert done == 10


@pytest.mark.parametrize("backend", DATABASE_LOCK_BACKENDS, indirect=True)
def test_a_lock_named_in_sql_is_the_lock_its_name_takes(setup) -> None:
    """Where a claim names its jobs' locks in SQL (from the id it reads), each must be the
    very lock ``job_lock_name`` names: rescue, eager claims and releases take them by name."""
    context, strategy, engine, ids = setup
    with engine.connect() as a, engine.connect() as b:
        namespace = context.queue_engine(a).tables.names.qualified_jobs
        prefix = job_lock_name(namespace, 0)[:-1]
        lock = strategy.locks.try_acquire_named_by(prefix)
        assert lock is not None, "database locks are taken in the claim's own SQL"
        names = [job_lock_name(namespace, job_id) for job_id in ids[:3]]
        assert strategy.locks.try_acquire(a, names[:2]) == [True, True]
        with b.begin():
            taken = b.execute(sa.select(*(lock(sa.literal(i)) for i in ids[:3]))).one()
        assert [bool(t) for t in taken] == [False, False, True]
        # Released by name, taken in SQL; released by key (a batch's release), free by name.
        strategy.locks.release(a, names[:2])
        unlock = strategy.locks.release_statement(prefix)
        if unlock is None:
            strategy.locks.release(b, names[2:])
        else:
            with b.begin():
                b.execute(unlock, {"keys": ids[2:3]})
        assert _free(strategy, a, context.queue_engine(a), ids[:3]) == [True] * 3


@pytest.mark.parametrize("backend", LOCK_BACKENDS, indirect=True)
def test_every_thread_window_claims_and_an_empty_window_falls_back(setup) -> None:
    """Threads claim from windows of their own (one statement where the database can): the
    windows of four threads take every job once, and a thread whose window lies past the end of
    the line still claims from its head."""
    context, strategy, engine, ids = setup
    with engine.connect() as conn, engine.connect() as other:
        queue_engine = context.queue_engine(conn)
        claims = [
            strategy.claim(conn, queue_engine.claims, "default", 10, f"test:{thread}")
            for thread in range(4)
        ]
        # The third thread's window (jobs 20 to 29 of those still waiting) is past the end.
        assert [len(claim) for claim in claims] == [10, 10, 10, 0]
        got = [job for claim in claims for job in claim]
        assert {job.id for job in got} == set(ids)
        assert all(job.status == "running" for job in got)
        assert _free(strategy, other, queue_engine, ids) == [False] * len(ids)
        strategy.release(conn, queue_engine.claims, got)
        assert _free(strategy, other, queue_engine, ids) == [True] * len(ids)


@pytest.mark.parametrize("backend", LOCK_BACKENDS, indirect=True)
def test_a_batch_outcome_commits_with_its_handlers_writes_and_alone_only_when_none_wrote(
    backend,
) -> None:
    """A committed claim's outcome commits in one transaction with whatever its handlers wrote:
    a job taken over meanwhile takes their writes back with it. Where no handler wrote, the
    fenced UPDATE and the release may each commit alone (PostgreSQL: autocommit, no BEGIN or
    COMMIT sent); a job taken over is then still left alone, and the connection comes back
    transactional."""
    app = backend.app()
    peer = backend.engine()
    jobs_table = app.tables.jobs

    def take_over(job_id: int) -> None:  # another worker's rescue and claim, committed
        with peer.begin() as other:
            other.execute(
                sa.update(jobs_table).where(jobs_table.c.id == job_id).values(worker_id="other:1:0")
            )

    def writes(job, session) -> None:
        if job.payload["lost"]:
            take_over(job.id)
        session.execute(effects.insert().values(job_id=job.id, note="handler"))

    def quiet(job, session) -> None:
        if job.payload["lost"]:
            take_over(job.id)

    app.task("writes")(writes)
    app.task("quiet")(quiet)
    context = app.context.reconfigured(strategy=backend.strategy)
    engine = context.create_engine()
    strategy = context.open_strategy(context.check_database(engine))
    autocommit: list[bool | None] = []

    def note(conn, cursor, statement, *args) -> None:
        if statement.lstrip().upper().startswith("UPDATE") and "succeeded" in str(args[0]):
            autocommit.append(getattr(cursor.connection, "autocommit", None))

    sa.event.listen(engine, "before_cursor_execute", note)
    executor = BatchExecutor(context, strategy, "test:a")
    try:
        ran = {}
        for task in ("writes", "quiet"):
            for lost in (False, True):
                job_id = app.enqueue(None, task, {"lost": lost})
                with engine.connect() as conn:
                    queue_engine = context.queue_engine(conn)
                    claim = functools.partial(
                        strategy.claim, conn, queue_engine.claims, "default", 10, "test:a"
                    )
                    claim_and_run(executor, conn, queue_engine, claim, lambda: False)
                    assert not conn.in_transaction()
                    if backend.statements_commit_alone:
                        assert conn.connection.dbapi_connection.autocommit is False
                ran[task, lost] = app.get_job(job_id)
    finally:
        sa.event.remove(engine, "before_cursor_execute", note)
        strategy.close()
        engine.dispose()
        peer.dispose()
    assert ran["writes", False]["status"] == "succeeded"
    assert ran["quiet", False]["status"] == "succeeded"
    assert ran["writes", True]["status"] == ran["quiet", True]["status"] == "running"
    assert ran["writes", True]["worker_id"] == ran["quiet", True]["worker_id"] == "other:1:0"
    # The handler that wrote and kept its job committed its row; the one taken over did not.
    assert backend.effect_ids() == [ran["writes", False]["id"]]
    if backend.statements_commit_alone:  # the writer's outcome in its transaction, alone else
        assert autocommit[:2] == [False, False] and autocommit[2:] == [True, True]

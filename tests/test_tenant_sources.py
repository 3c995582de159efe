"""The forms ``App(tenant_databases=…)`` takes, refused when wrong at creation; a callable's
Engine, None and exception; the LRU cache's order; eager mode. Tenant databases here are real
SQLite files (the server databases are in tests/contract/test_tenant_databases.py)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support.tenant_dbs import metadata, notes

import dbqueue
from dbqueue.errors import ConfigurationError
from dbqueue.migrations import migrate


def _tenant_file(tmp_path, tenant) -> str:
    url = f"sqlite:///{tmp_path / f'tenant_{tenant}.db'}"
    engine = sa.create_engine(url)
    metadata.create_all(engine)
    engine.dispose()
    return url


def _count(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(notes)).scalar_one()
    finally:
        engine.dispose()


def _app(tmp_path, source, **options) -> dbqueue.App:
    app = dbqueue.App(
        f"sqlite:///{tmp_path / 'queue.db'}",
        tenant_databases=source,
        backoff=lambda attempt: 0.0,
        **options,
    )
    migrate.upgrade(app.engine, app.names)

    @app.task("note", tenant_database=True)
    def note(job, session, tenant_session):
        tenant_session.execute(notes.insert().values(job_id=job.id, tenant=str(job.tenant)))

    return app


def _run(app):
    return app.run_worker(burst=True, poll_interval=0.02, install_signal_handlers=False)


def _messages(app) -> dict[int, str]:
    with app.engine.connect() as conn:
        jobs = app.tables.jobs
        return dict(conn.execute(sa.select(jobs.c.id, jobs.c.message)).all())


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("sqlite:///no-placeholder.db", "is a URL without {tenant}"),
        (42, "not int"),
        ([("a", "b")], "not list"),
    ],
)
def test_a_wrong_source_is_refused_at_creation(source, problem):
    with pytest.raises(ConfigurationError, match=problem):
        dbqueue.App("sqlite:///q.db", tenant_databases=source)


def test_a_cache_size_below_one_is_refused():
    with pytest.raises(ConfigurationError, match="tenant_cache_size=0 must be"):
        dbqueue.App("sqlite:///q.db", tenant_databases={}, tenant_cache_size=0)
    with pytest.raises(ConfigurationError, match="DBQUEUE_TENANT_CACHE_SIZE='x' is not"):
        dbqueue.App("sqlite:///q.db", environ={"DBQUEUE_TENANT_CACHE_SIZE": "x"})


def test_a_callable_source_engine_none_and_exception(tmp_path):
    own = sa.create_engine(_tenant_file(tmp_path, 1))

    def source(tenant):
        if tenant == 1:
            return own  # the caller's engine: used, never disposed by dbqueue
        if tenant == 2:
            return None
        raise RuntimeError("directory offline")

    app = _app(tmp_path, source, max_attempts=1)
    ok, unknown, broken = (app.enqueue(None, "note", {}, tenant=t) for t in (1, 2, 3))
    summary = _run(app)
    assert (summary.succeeded, summary.failed) == (1, 2)
    messages = _messages(app)
    assert messages[unknown] == (
        f"tenant 2 (job {unknown}): unknown tenant (tenant_databases has no database for it)"
    )
    assert messages[broken] == (
        f"tenant 3 (job {broken}): the tenant_databases callable raised RuntimeError: "
        "directory offline"
    )
    with own.connect() as conn:  # still usable: not disposed behind the caller's back
        assert conn.execute(sa.select(notes.c.job_id)).scalars().all() == [ok]
    own.dispose()


def test_the_cache_keeps_the_most_recently_used_engines(tmp_path):
    urls = {t: _tenant_file(tmp_path, t) for t in (1, 2, 3)}
    app = _app(tmp_path, urls, tenant_cache_size=2)
    tenants = app.context.tenants
    seen = []

    @app.task("look", tenant_database=True)
    def look(job, session, tenant_session):
        seen.append((tenants.cached(), tenants.disposed))

    for tenant in (1, 2, 1, 3):  # 2 is then the least recently used: evicted for 3
        app.enqueue(None, "look", {}, tenant=tenant)
    assert _run(app).succeeded == 4
    assert seen == [([1], 0), ([1, 2], 0), ([2, 1], 0), ([1, 3], 1)]
    # The worker's stop disposed the rest.
    assert (tenants.created, tenants.disposed, tenants.cached()) == (3, 3, [])


def test_eager_mode_gives_the_tenant_session_too(tmp_path):
    urls = {5: _tenant_file(tmp_path, 5)}
    app = _app(tmp_path, urls, eager=True)
    app.enqueue(None, "note", {}, tenant=5)
    assert _count(urls[5]) == 1


def test_a_seed_worker_outside_multi_database_mode_gets_multi_db_conn_none(tmp_path):
    """As in the seed 1.2: every execute declares multi_db_conn; without MULTI_DATABASE it is
    None, and the jobs run."""
    from dbqueue.compat import WorkerBase

    app = dbqueue.App(f"sqlite:///{tmp_path / 'queue.db'}", environ={})
    migrate.upgrade(app.engine, app.names)
    given = []

    class SeedWorker(WorkerBase):
        def execute(self, payload, tarefa, bd_conn, multi_db_conn):
            given.append(multi_db_conn)
            return "ok"

    worker = SeedWorker(app, burst=True, poll_interval=0.02, install_signal_handlers=False)
    app.enqueue(None, "anything", {}, tenant=3)
    assert worker.run().succeeded == 1
    assert given == [None]


def test_a_batch_task_cannot_take_a_tenant_database():
    app = dbqueue.App("sqlite:///q.db", tenant_databases={})
    with pytest.raises(ConfigurationError, match="tenant_database=True is for @app.task"):

        @app.batch_task("many", tenant_database=True)
        def many(jobs, session):
            pass

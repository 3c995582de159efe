"""Per-tenant databases (issue 17), with the queue on every database: a job's handler gets an
ORM Session on its tenant's own database (two PostgreSQL databases and a MariaDB one), whose
writes commit with the job and only then; an unknown or missing tenant is a clear failed attempt;
the seed's WorkerBase / WorkerPubSubBase get it as ``multi_db_conn``."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from support.backends import effects
from support.tenant_dbs import BASE, mysql_databases, notes, postgresql_databases, rows

import dbqueue
from dbqueue.compat import Subscriber, WorkerBase, WorkerPubSubBase

PG_A, PG_B, MARIA = f"{BASE}tenant_1", f"{BASE}tenant_2", f"{BASE}tenant_3"


@pytest.fixture(scope="module")
def _created() -> dict[str, str]:
    return {**postgresql_databases([PG_A, PG_B]), **mysql_databases([MARIA])}


@pytest.fixture
def tenant_urls(_created: dict[str, str]) -> dict[int, str]:
    """tenant → URL: 1 and 2 on PostgreSQL, 3 on MariaDB, their notes tables empty."""
    postgresql_databases([PG_A, PG_B])
    mysql_databases([MARIA])
    return {1: _created[PG_A], 2: _created[PG_B], 3: _created[MARIA]}


def note(tenant_session: Session, job: dbqueue.Job) -> None:
    tenant_session.execute(
        notes.insert().values(job_id=job.id, tenant=str(job.tenant), attempt=job.attempt)
    )


def test_a_job_for_a_tenant_writes_only_to_that_tenants_database(database, tenant_urls):
    app = database.app(tenant_databases=tenant_urls)
    seen: dict[int, Any] = {}

    @app.task("note", tenant_database=True)
    def handler(job, session, tenant_session):
        assert isinstance(tenant_session, Session)
        seen[job.id] = tenant_session.get_bind().url.database
        note(tenant_session, job)
        session.execute(effects.insert().values(job_id=job.id, note="queue side"))

    ids = {t: [app.enqueue(None, "note", {}, tenant=t) for _ in range(2)] for t in (1, 2, 3)}
    summary = database.run_worker(app)
    assert (summary.succeeded, summary.failed) == (6, 0)
    for tenant, url in tenant_urls.items():
        assert rows(url) == [(i, str(tenant), 1) for i in ids[tenant]]
    assert seen == {
        i: name for t, name in zip((1, 2, 3), (PG_A, PG_B, MARIA), strict=True) for i in ids[t]
    }
    assert database.effect_ids() == sorted(i for group in ids.values() for i in group)


def test_a_failing_handler_leaves_nothing_in_the_tenant_database(database, tenant_urls):
    app = database.app(tenant_databases=tenant_urls, max_attempts=2, backoff=lambda attempt: 0.0)

    @app.task("half", tenant_database=True)
    def half(job, session, tenant_session):
        note(tenant_session, job)
        tenant_session.commit()  # only flushes: dbqueue commits with the job
        raise RuntimeError("failed after writing to the tenant")

    job_ids = [app.enqueue(None, "half", {}, tenant=t) for t in (1, 3)]
    summary = database.run_worker(app)
    assert (summary.succeeded, summary.failed) == (0, 4)
    assert rows(tenant_urls[1]) == [] and rows(tenant_urls[3]) == []
    jobs = {j["id"]: j for j in database.jobs()}
    for job_id in job_ids:
        assert jobs[job_id]["status"] == "dead" and jobs[job_id]["attempt"] == 2
        assert jobs[job_id]["message"].startswith("RuntimeError: failed after writing")


def test_an_unknown_or_missing_tenant_is_a_clear_failed_attempt(database, tenant_urls):
    app = database.app(tenant_databases=tenant_urls, max_attempts=2, backoff=lambda attempt: 0.0)
    ran = []

    @app.task("note", tenant_database=True)
    def handler(job, session, tenant_session):
        ran.append(job.id)

    unknown = app.enqueue(None, "note", {}, tenant=99)
    missing = app.enqueue(None, "note", {})
    summary = database.run_worker(app)
    assert (summary.succeeded, summary.failed, ran) == (0, 4, [])
    jobs = {j["id"]: j for j in database.jobs()}
    assert jobs[unknown]["status"] == "dead" and jobs[unknown]["attempt"] == 2
    assert jobs[unknown]["message"].startswith(f"tenant 99 (job {unknown}): unknown tenant")
    assert jobs[missing]["status"] == "dead"
    assert jobs[missing]["message"].startswith(f"job {missing} (task 'note') has no tenant")


class NotesWorker(WorkerBase):
    """A seed worker in multi-database mode: its execute declares multi_db_conn."""

    def execute(self, payload, tarefa, bd_conn, multi_db_conn):
        note(multi_db_conn, tarefa)
        bd_conn.execute(effects.insert().values(job_id=tarefa.id, note=payload["text"]))
        return "noted"


class NotesSubscriber(WorkerPubSubBase):
    @Subscriber("tenant-notes")
    def on_note(self, payload, subscription, tarefa, bd_conn, multi_db_conn):
        note(multi_db_conn, tarefa)
        return f"noted for {subscription['id']}"


def test_seed_workers_get_multi_db_conn(database, tenant_urls):
    app = database.app(tenant_databases=tenant_urls)
    worker = NotesWorker(app, burst=True, poll_interval=0.02, install_signal_handlers=False)
    first = app.enqueue(None, "anything", {"text": "one"}, tenant=1)
    second = app.enqueue(None, "other", {"text": "two"}, tenant=3)
    summary = worker.run(strategy=database.strategy)
    assert (summary.succeeded, summary.failed) == (2, 0)
    assert rows(tenant_urls[1]) == [(first, "1", 1)]
    assert rows(tenant_urls[3]) == [(second, "3", 1)]
    messages = {j["id"]: j["message"] for j in database.jobs()}
    assert messages[first] == messages[second] == "noted"

    pubsub_app = database.app(tenant_databases=tenant_urls)
    pubsub_app.add_subscription(None, "tenant-notes", "invoice.created")
    subscriber = NotesSubscriber(
        pubsub_app, burst=True, poll_interval=0.02, install_signal_handlers=False
    )
    pubsub_app.publish(None, "invoice.created", {"n": 1}, tenant=2)
    summary = subscriber.run(strategy=database.strategy)
    assert (summary.succeeded, summary.failed) == (1, 0)
    [(delivery_id, tenant, attempt)] = rows(tenant_urls[2])
    assert (tenant, attempt) == ("2", 1)
    delivery = next(j for j in database.jobs() if j["id"] == delivery_id)
    assert delivery["subscription_id"] == "tenant-notes"
    assert delivery["message"] == "noted for tenant-notes"


def test_a_failed_tenant_commit_fails_the_job_and_its_queue_writes(postgresql, tenant_urls):
    """PostgreSQL checks a deferred constraint at COMMIT: the tenant's commit fails after the
    handler returned, so the job's own writes (made in the queue's transaction) roll back."""
    engine = sa.create_engine(tenant_urls[1])
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE IF EXISTS deferred_once"))
        conn.execute(
            sa.text(
                "CREATE TABLE deferred_once (k int, CONSTRAINT one_k UNIQUE (k) "
                "DEFERRABLE INITIALLY DEFERRED)"
            )
        )
    engine.dispose()
    app = postgresql.app(tenant_databases=tenant_urls, max_attempts=1)

    @app.task("twice", tenant_database=True)
    def twice(job, session, tenant_session):
        session.execute(effects.insert().values(job_id=job.id, note="queue side"))
        tenant_session.execute(sa.text("INSERT INTO deferred_once VALUES (1), (1)"))

    job_id = app.enqueue(None, "twice", {}, tenant=1)
    summary = postgresql.run_worker(app)
    assert (summary.succeeded, summary.failed) == (0, 1)
    [job] = postgresql.jobs()
    assert job["id"] == job_id and job["status"] == "dead"
    assert job["message"].startswith("tenant 1: the tenant database's commit failed")
    assert postgresql.effect_ids() == []

"""Idle workers wake when work arrives, without waiting for their poll.

Each worker here polls once an hour: a job done within the test's (generous) deadline can only
have been picked up by a wake-up — in-process after a local enqueue commits, or for an insert
from anywhere else by PostgreSQL's NOTIFY or SQLite's commit watch.
"""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from support.backends import database_keys
from support.idle_worker import IdleWorker
from support.waiting import wait_for

from dbqueue import dialects


def dialect_of(app) -> dialects.Dialect:
    """The app's connected Dialect (its notifier and finish listener are instance methods)."""
    with app.engine.connect() as conn:
        return dialects.for_sqlalchemy(conn.dialect)


@pytest.mark.parametrize("target", ["engine", "session", "connection"])
def test_a_local_enqueue_wakes_this_process_workers_on_commit(backend, target):
    app = backend.app()
    with IdleWorker(app, backend.strategy) as running:
        if target == "engine":
            job_id = app.enqueue(None, "wake", {})
        elif target == "session":
            with Session(app.engine) as session, session.begin():
                job_id = app.enqueue(session, "wake", {})
        else:
            with app.engine.connect() as conn, conn.begin():
                job_id = app.enqueue(conn, "wake", {})
        running.wait_for(job_id)


@pytest.mark.parametrize(
    "backend", database_keys(lambda spec: spec.inserts_wake_workers), indirect=True
)
def test_an_insert_from_elsewhere_wakes_workers(backend):
    """PostgreSQL's insert trigger NOTIFYs; SQLite's workers watch the database's commits
    (``PRAGMA data_version``). MariaDB only polls."""
    database = backend
    with IdleWorker(database.app(), database.strategy) as running:
        other = database.app()  # another App: no in-process wake-up reaches the worker
        with other.engine.begin() as conn:
            conn.execute(sa.text(f"INSERT INTO {other.names.jobs} (task) VALUES ('wake')"))
            job_id = conn.execute(sa.text(f"SELECT max(id) FROM {other.names.jobs}")).scalar()
        running.wait_for(job_id)
        other.engine.dispose()


def test_the_commit_watch_sees_changes_not_empty_claims(commit_watched_database):
    """What wakes an idle SQLite worker: a commit that changed the database, from any
    connection; not an idle worker's claim that found nothing (it changes no page), so idle
    workers never wake one another."""
    database = commit_watched_database
    app = database.app()

    @app.task("t")
    def t(job, session):
        return None

    watch = dialect_of(app).notifier(app.engine, app.names.qualified_jobs)
    watch.open()
    try:
        assert not watch.changed()
        database.run_worker(app)  # claims on an empty queue
        assert not watch.changed()
        app.enqueue(None, "t", {})
        assert watch.changed()
        assert not watch.changed()  # seen once
        database.run_worker(app)
        assert watch.changed()  # the job ran: its success was committed
    finally:
        watch.close()


def test_a_commit_watching_caller_is_told_to_look_again_after_a_commit_elsewhere(
    commit_watched_database,
):
    """``app.call`` on SQLite: the caller's watch says "look again" after a commit by any other
    connection (a worker's completion among them), besides its own polls."""
    database = commit_watched_database
    app = database.app()
    told: list[list[int] | None] = []
    watch = dialect_of(app).finish_listener(app.engine, app.names.qualified_jobs, told.append)
    assert watch is not None
    watch.start()
    try:
        assert watch.listening.wait(10)
        wait_for(lambda: told, 10, "the watch's first look")  # after connecting: look once
        told.clear()
        database.app().enqueue(None, "t", {})  # another App: a commit from another connection
        wait_for(lambda: told, 10, "the watch to see the commit")
        assert set(map(repr, told)) == {"None"}
    finally:
        watch.stop()


def test_the_listener_reconnects_after_losing_its_connection(notifying_database):
    database = notifying_database
    with IdleWorker(database.app(), database.strategy) as running:
        other = database.app()
        with other.engine.begin() as conn:
            killed = conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
                )
            ).all()
        assert killed, "no LISTEN connection found"
        time.sleep(1.5)  # reconnect backoff
        job_id = other.enqueue(None, "wake", {})
        running.wait_for(job_id)
        other.engine.dispose()


def test_a_delayed_job_runs_on_time_where_inserts_push(notifying_database):
    with IdleWorker(notifying_database.app(), notifying_database.strategy) as running:
        other = notifying_database.app()
        job_id = other.enqueue(None, "wake", {}, delay=1.0)
        # The insert's NOTIFY wakes the worker; finding nothing runnable yet, it sleeps until the
        # job's run_at instead of for the hour-long poll.
        running.wait_for(job_id)
        other.engine.dispose()

"""Idle workers wake when work arrives, without waiting for their poll.

Each worker here polls once an hour: a job done within the test's (generous) deadline can only
have been picked up by a wake-up — in-process after a local enqueue commits, or by PostgreSQL's
NOTIFY for an insert from anywhere else.
"""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

HOUR = 3600.0


class RunningWorker:
    def __init__(self, app, strategy: str, **options):
        self.done: list[int] = []

        @app.task("wake")
        def wake(job, session):
            self.done.append(job.id)

        self.worker = app.worker(
            strategy=strategy,
            poll_interval=HOUR,
            min_poll_interval=HOUR,
            install_signal_handlers=False,
            maintenance=False,
            **options,
        )
        self.thread = threading.Thread(target=self.worker.run)

    def __enter__(self) -> RunningWorker:
        self.thread.start()
        time.sleep(0.5)  # its first claim finds nothing; it is now asleep for an hour
        return self

    def __exit__(self, *exc) -> None:
        self.worker.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()

    def wait_for(self, job_id: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while job_id not in self.done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert job_id in self.done, f"job {job_id} was not picked up: the worker was not woken"


@pytest.mark.parametrize("target", ["engine", "session", "connection"])
def test_a_local_enqueue_wakes_this_process_workers_on_commit(backend, target):
    app = backend.app()
    with RunningWorker(app, backend.strategy) as running:
        if target == "engine":
            job_id = app.enqueue(None, "wake", {})
        elif target == "session":
            with Session(app.engine) as session, session.begin():
                job_id = app.enqueue(session, "wake", {})
        else:
            with app.engine.connect() as conn, conn.begin():
                job_id = app.enqueue(conn, "wake", {})
        running.wait_for(job_id)


def test_an_insert_from_elsewhere_wakes_postgresql_workers(postgresql):
    with RunningWorker(postgresql.app(), postgresql.strategy) as running:
        other = postgresql.app()  # another App: no in-process wake-up reaches the worker
        with other.engine.begin() as conn:
            conn.execute(sa.text(f"INSERT INTO {other.names.jobs} (task) VALUES ('wake')"))
            job_id = conn.execute(sa.text(f"SELECT max(id) FROM {other.names.jobs}")).scalar()
        running.wait_for(job_id)
        other.engine.dispose()


def test_the_listener_reconnects_after_losing_its_connection(postgresql):
    with RunningWorker(postgresql.app(), postgresql.strategy) as running:
        other = postgresql.app()
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


def test_a_delayed_job_runs_on_time_where_inserts_push(postgresql):
    with RunningWorker(postgresql.app(), postgresql.strategy) as running:
        other = postgresql.app()
        job_id = other.enqueue(None, "wake", {}, delay=1.0)
        # The insert's NOTIFY wakes the worker; finding nothing runnable yet, it sleeps until the
        # job's run_at instead of for the hour-long poll.
        running.wait_for(job_id)
        other.engine.dispose()

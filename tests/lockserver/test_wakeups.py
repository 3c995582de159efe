"""Idle workers on the lock server are woken by pushes, on every database.

The worker polls the database once an hour: a job done within the test's (generous) deadline
was picked up because the server pushed "work available" — after another App's enqueue hinted
it (with the server's own poll an hour apart, so only the hint can explain it), or when the
server's poll of the table found a job inserted with plain SQL.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import sqlalchemy as sa
from support.backends import backend_keys
from support.idle_worker import HOUR, IdleWorker
from support.lockserver import start_server

LOCK_SERVER_BACKENDS = backend_keys(lambda spec: spec.claims_through_lock_server)

pytestmark = pytest.mark.parametrize("backend", LOCK_SERVER_BACKENDS, indirect=True)


class LockServerIdleWorker(IdleWorker):
    def __init__(self, app):
        super().__init__(app, "lock_server")

    def wait_until_idle(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # subscribed, and its first claim found nothing
            if self.worker.summary.rounds >= self.worker.concurrency and self.subscribed():
                return
            time.sleep(0.02)
        raise AssertionError("the worker did not start")

    def subscribed(self) -> bool:
        notifier = self.worker.notifier
        return (
            notifier is not None
            and getattr(notifier, "client", None) is not None
            and (notifier.client.connected)
        )


def test_an_enqueue_elsewhere_hints_the_server_which_wakes_the_worker(backend, tmp_path):
    # This server polls the table once an hour: only the enqueue's hint can wake the worker.
    server = start_server(
        backend.url,
        backend.prefix,
        tmp_path / "server.log",
        extra=("--check-tasks-interval", str(HOUR)),
    )
    try:
        backend = dataclasses.replace(backend, server=server.address)
        with LockServerIdleWorker(backend.app()) as idle:
            other = backend.app()  # another App: no in-process wake-up reaches the worker
            job_id = other.enqueue(None, "wake", {})
            idle.wait_for(job_id)
            other.engine.dispose()
    finally:
        assert server.stop() == 0, server.tail()


def test_a_plain_sql_insert_is_found_by_the_server_poll(backend):
    with LockServerIdleWorker(backend.app()) as idle:
        engine = backend.engine()
        try:
            with engine.begin() as conn:  # nobody hints: the server's poll (every 1 s) finds it
                conn.execute(sa.text(f"INSERT INTO {backend.prefix}jobs (task) VALUES ('wake')"))
                job_id = conn.execute(sa.text(f"SELECT max(id) FROM {backend.prefix}jobs")).scalar()
        finally:
            engine.dispose()
        idle.wait_for(job_id)


def test_a_delayed_job_runs_on_time(backend):
    with LockServerIdleWorker(backend.app()) as idle:
        other = backend.app()
        job_id = other.enqueue(None, "wake", {}, delay=1.0)
        # The hint wakes the worker; finding nothing runnable yet, it sleeps until the job's
        # run_at instead of for the hour-long poll.
        idle.wait_for(job_id)
        other.engine.dispose()

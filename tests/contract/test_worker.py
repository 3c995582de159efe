"""Worker limits, stopping, and start-up checks, on every backend."""

from __future__ import annotations

import threading
import time

import pytest
from support.backends import effects

import dbqueue
from dbqueue import strategies


def effect_app(backend, **options):
    app = backend.app(**options)

    @app.task("effect")
    def effect(job, session):
        session.execute(effects.insert().values(job_id=job.id, note="ran"))

    return app


def test_max_jobs_stops_after_exactly_that_many(backend):
    app = effect_app(backend)
    app.enqueue_many(None, [{"task": "effect"} for _ in range(10)])
    summary = backend.run_worker(app, max_jobs=4, concurrency=2, batch_size=3)
    assert summary.processed == 4
    statuses = sorted(j["status"] for j in backend.jobs())
    assert statuses == ["available"] * 6 + ["succeeded"] * 4
    assert len(backend.effect_ids()) == 4


def test_max_runtime_stops_an_idle_worker(backend):
    app = effect_app(backend)
    started = time.monotonic()
    summary = backend.run_worker(app, burst=False, max_runtime=0.3, poll_interval=0.05)
    assert summary.processed == 0
    assert time.monotonic() - started < 10  # it returned at all (pytest-timeout guards a hang)


def test_max_runtime_stops_an_idle_worker_with_many_threads_and_a_long_poll(backend):
    """Threads asleep until their next poll (followers wait up to 30 s) are woken at the
    deadline: the worker returns about when its max runtime ends, not 30 s later."""
    app = effect_app(backend)
    started = time.monotonic()
    summary = backend.run_worker(app, burst=False, max_runtime=1, concurrency=3, poll_interval=20)
    assert summary.processed == 0
    assert time.monotonic() - started < 8  # before the fix: 30 s or more


def test_stop_finishes_the_running_job_and_releases_the_rest_of_the_batch(backend):
    app = backend.app()
    worker_box = {}
    ran = []

    @app.task("stopper")
    def stopper(job, session):
        ran.append(job.payload)
        session.execute(effects.insert().values(job_id=job.id, note="ran"))
        if job.payload == 2:
            worker_box["worker"].stop()  # as SIGTERM would, mid-batch

    app.enqueue_many(None, [{"task": "stopper", "payload": i} for i in range(8)])
    worker = app.worker(
        strategy=backend.strategy, batch_size=8, poll_interval=0.02, install_signal_handlers=False
    )
    worker_box["worker"] = worker
    summary = worker.run()
    assert ran == [0, 1, 2]  # batches of 1 then 2 (the batch grows while jobs are fast)
    assert summary.succeeded == 3
    jobs = backend.jobs()
    assert [j["status"] for j in jobs] == ["succeeded"] * 3 + ["available"] * 5
    assert all(j["attempt"] == 0 and j["started_at"] is None for j in jobs[3:])
    assert len(backend.effect_ids()) == 3


def test_stop_from_another_thread_ends_a_waiting_worker(backend):
    app = effect_app(backend)
    worker = app.worker(strategy=backend.strategy, poll_interval=5, install_signal_handlers=False)
    threading.Timer(0.3, worker.stop).start()
    started = time.monotonic()
    worker.run()
    assert time.monotonic() - started < 4  # woken by stop(), not by the 5 s poll


def test_missing_schema_tells_the_user_to_migrate(backend):
    app = dbqueue.App(backend.url, table_prefix="not_migrated_")
    with pytest.raises(dbqueue.SchemaMissingError, match="run `dbqueue migrate`"):
        app.run_worker(burst=True, install_signal_handlers=False)
    with pytest.raises(dbqueue.SchemaMissingError, match="run `dbqueue migrate`"):
        app.enqueue(None, "t", {})


UNKNOWN_STRATEGY = "no_such_strategy"


@pytest.mark.parametrize("strategy", [*strategies.STRATEGY_NAMES, UNKNOWN_STRATEGY])
def test_a_strategy_the_database_cannot_do_is_refused_at_start_up(database, strategy, lock_server):
    """Every strategy BACKENDS pairs with the database runs; every other one is refused."""
    app = effect_app(database)
    if strategy in database.paired_strategies:
        through_server = strategies.STRATEGIES[strategy].claims_through_lock_server
        server = lock_server(database) if through_server else None
        assert app.run_worker(
            strategy=strategy, lock_server=server, burst=True, install_signal_handlers=False
        )
        return
    error = dbqueue.ConfigurationError  # an unknown name
    if strategy != UNKNOWN_STRATEGY:
        error = dbqueue.StrategyNotSupportedError
    with pytest.raises(error) as raised:
        app.run_worker(strategy=strategy, burst=True, install_signal_handlers=False)
    assert strategy in str(raised.value)
    assert "--strategy" in str(raised.value) or "choose one of" in str(raised.value)


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"concurrency": 0}, "concurrency"),
        ({"batch_size": -1}, "batch_size"),
        ({"max_jobs": 0}, "max_jobs"),
        ({"max_runtime": -5}, "max_runtime"),
        ({"queues": ["ok", "not ok!"]}, "queue name"),
    ],
)
def test_bad_worker_options_are_refused(backend, options, fragment):
    app = effect_app(backend)
    with pytest.raises(dbqueue.ConfigurationError, match=fragment):
        app.worker(**options)

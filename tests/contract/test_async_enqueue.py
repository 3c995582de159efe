"""Async enqueue (aenqueue, aenqueue_many, apublish), on every backend: the jobs commit with the
caller's AsyncSession or AsyncConnection or not at all, a worker runs them, committing wakes the
workers, and bad input fails with the sync calls' own one-line errors.

Where the database has no asyncio driver (the SingleStore path), an AsyncSession cannot exist:
there the calls with target None (dbqueue's own transaction, run on a thread) are what is tested.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from support.backends import backend_keys, effects
from support.idle_worker import IdleWorker

import dbqueue

BUSINESS_ROW = 10**9  # an effects row the caller writes next to its enqueue


def _app_with_handlers(backend):
    app = backend.app(max_attempts=1)

    @app.task("t")
    def t(job, session):
        session.execute(effects.insert().values(job_id=job.id, note=f"t {job.payload}"))

    @app.subscriber("topic", "sub")
    def sub(job, session):
        session.execute(effects.insert().values(job_id=job.id, note="delivery"))

    app.add_subscription(None, "sub", "topic")
    return app


async def _in_callers_transactions(app) -> tuple[list[int], list[int]]:
    """Rolled-back and committed async enqueues; returns (committed job ids, business rows).
    (Deliveries are counted apart; ``aenqueue_many`` returns ids where the database can.)"""
    engine = app.create_async_engine()
    committed: list[int] = []
    try:
        async with AsyncSession(engine) as session:
            async with session.begin():
                await session.execute(effects.insert().values(job_id=BUSINESS_ROW + 1))
                await app.aenqueue(session, "t", "rolled back")
                await app.aenqueue_many(session, [{"task": "t", "payload": "rolled back"}])
                await app.apublish(session, "topic", "rolled back")
                await session.rollback()
            async with session.begin():
                await session.execute(effects.insert().values(job_id=BUSINESS_ROW + 2))
                committed.append(await app.aenqueue(session, "t", "session", priority=5))
                many = await app.aenqueue_many(
                    session, [{"task": "t", "payload": i, "queue": "default"} for i in range(3)]
                )
                committed += many
                await app.apublish(session, "topic", {"from": "session"})
        async with engine.connect() as conn:
            await app.aenqueue(conn, "t", "rolled back")
            await conn.rollback()
            committed.append(await app.aenqueue(conn, "t", "connection"))
            await conn.commit()
    finally:
        await engine.dispose()
    return committed, [BUSINESS_ROW + 2]


async def _in_dbqueue_transactions(app) -> list[int]:
    try:
        ids = [await app.aenqueue(None, "t", "own", delay=dt.timedelta(0))]
        many = await app.aenqueue_many(None, [{"task": "t", "payload": "own many"}])
        # Where an INSERT cannot return ids (SingleStore), enqueue_many returns none either.
        ids += many or [-1]
        assert await app.aenqueue_many(None, []) == []
        await app.apublish(None, "topic", {"from": "own"})
        return ids
    finally:
        await app.adispose()


def test_async_enqueue_commits_with_the_caller_and_a_worker_runs_the_jobs(backend):
    app = _app_with_handlers(backend)
    committed, business = [], []
    if app.context.has_async_driver:
        committed, business = asyncio.run(_in_callers_transactions(app))
    committed += asyncio.run(_in_dbqueue_transactions(app))

    jobs = backend.jobs()
    deliveries = [j["id"] for j in jobs if j["subscription_id"] == "sub"]
    publications = [j for j in jobs if j["task"] == "topic" and j["status"] == "succeeded"]
    expected_publications = 2 if business else 1
    assert len(deliveries) == len(publications) == expected_publications
    runnable = sorted(j["id"] for j in jobs if j["status"] == "available")
    known = [i for i in committed if i > 0]
    assert len(runnable) == len(committed + deliveries)  # nothing from the rolled-back calls
    assert set(known + deliveries) <= set(runnable)
    assert all(j["payload"] != "rolled back" for j in jobs)
    assert backend.effect_ids() == business

    summary = backend.run_worker(app)
    assert summary.succeeded == len(runnable) and summary.failed == 0
    assert backend.effect_ids() == sorted(runnable + business)


def _bad_calls():
    """(name, sync call, async call): each must fail the same way, before any SQL."""
    big = "x" * 100
    return [
        ("option", lambda a: a.enqueue(None, "t", prio=1), lambda a: a.aenqueue(None, "t", prio=1)),
        (
            "priority",
            lambda a: a.enqueue(None, "t", priority="high"),
            lambda a: a.aenqueue(None, "t", priority="high"),
        ),
        (
            "timing",
            lambda a: a.enqueue(None, "t", delay=1, run_at=dt.datetime.now(dt.timezone.utc)),
            lambda a: a.aenqueue(None, "t", delay=1, run_at=dt.datetime.now(dt.timezone.utc)),
        ),
        (
            "tenant",
            lambda a: a.enqueue(None, "t", tenant="seven"),
            lambda a: a.aenqueue(None, "t", tenant="seven"),
        ),
        ("payload", lambda a: a.enqueue(None, "t", big), lambda a: a.aenqueue(None, "t", big)),
        (
            "unencodable",
            lambda a: a.enqueue(None, "t", {1, 2}),
            lambda a: a.aenqueue(None, "t", {1, 2}),
        ),
        (
            "many",
            lambda a: a.enqueue_many(None, [{"task": "t"}, {"payload": 1}]),
            lambda a: a.aenqueue_many(None, [{"task": "t"}, {"payload": 1}]),
        ),
        (
            "publish",
            lambda a: a.publish(None, "topic", queue="no spaces"),
            lambda a: a.apublish(None, "topic", queue="no spaces"),
        ),
    ]


def test_async_bad_input_gives_the_sync_calls_errors(database):
    app = database.app(max_payload_bytes=64)
    for name, sync_call, async_call in _bad_calls():
        with pytest.raises(Exception) as sync_error:
            sync_call(app)
        with pytest.raises(Exception) as async_error:
            asyncio.run(async_call(app))
        assert type(async_error.value) is type(sync_error.value), name
        # The call's own name, and only that, differs.
        sync_text = re.sub(
            r"\b(enqueue_many|enqueue|publish)(?=[(:])", r"a\1", str(sync_error.value)
        )
        assert str(async_error.value) == sync_text, name
        assert "\n" not in sync_text, name
    assert database.jobs() == []


def test_targets_of_the_other_kind_are_refused_with_the_fix(database):
    app = database.app()
    with Session(app.engine) as session, pytest.raises(TypeError, match=r"app\.enqueue\(\)"):
        asyncio.run(app.aenqueue(session, "t"))
    with pytest.raises(TypeError, match=r"cannot aenqueue\(\) through str"):
        asyncio.run(app.aenqueue("postgresql://", "t"))
    if app.context.has_async_driver:

        async def sync_call_with_async_session():
            engine = app.create_async_engine()
            try:
                async with AsyncSession(engine) as session:
                    app.enqueue(session, "t")
            finally:
                await engine.dispose()

        with pytest.raises(TypeError, match=r"await the async call \(app\.aenqueue"):
            asyncio.run(sync_call_with_async_session())
    assert database.jobs() == []


def _wakes_idle_worker(backend, target: str) -> None:
    app = backend.app()
    if not app.context.has_async_driver:
        target = "none"  # dbqueue's own transaction, on a thread

    async def enqueue() -> int:
        if target == "none":
            try:
                return await app.aenqueue(None, "wake", {})
            finally:
                await app.adispose()
        engine = app.create_async_engine()
        try:
            if target == "session":
                async with AsyncSession(engine) as session, session.begin():
                    return await app.aenqueue(session, "wake", {})
            async with engine.connect() as conn, conn.begin():
                return await app.aenqueue(conn, "wake", {})
        finally:
            await engine.dispose()

    with IdleWorker(app, backend.strategy) as running:
        running.wait_for(asyncio.run(enqueue()))


def test_an_async_session_commit_wakes_this_process_workers(backend):
    _wakes_idle_worker(backend, "session")


def test_an_async_connection_commit_wakes_this_process_workers(database):
    _wakes_idle_worker(database, "connection")


def test_an_async_enqueue_from_another_app_wakes_workers_through_notify(notifying_database):
    """No in-process wake-up reaches the worker: the insert's NOTIFY (sent by the asyncio
    driver's commit) does."""
    database = notifying_database
    with IdleWorker(database.app(), database.strategy) as running:
        other = database.app()

        async def enqueue() -> int:
            try:
                async with AsyncSession(other.async_engine) as session, session.begin():
                    return await other.aenqueue(session, "wake", {})
            finally:
                await other.adispose()

        running.wait_for(asyncio.run(enqueue()))


@pytest.mark.parametrize(
    "backend", backend_keys(lambda spec: spec.claims_through_lock_server), indirect=True
)
def test_an_async_enqueue_from_another_app_wakes_workers_through_the_lock_server(backend):
    """No in-process wake-up reaches the worker: the hint the commit sends the lock server
    does (where the database has no asyncio driver, through the sync path on a thread)."""
    with IdleWorker(backend.app(), backend.strategy) as running:
        other = backend.app()

        async def enqueue() -> int:
            try:
                if not other.context.has_async_driver:
                    return await other.aenqueue(None, "wake", {})
                async with AsyncSession(other.async_engine) as session, session.begin():
                    return await other.aenqueue(session, "wake", {})
            finally:
                await other.adispose()

        running.wait_for(asyncio.run(enqueue()))


def test_async_url_names_the_driver(database, monkeypatch):
    """DBQUEUE_ASYNC_URL (or App(async_url=…)) is the async engine's URL, kept as given."""
    app = database.app()
    if not app.context.has_async_driver:
        with pytest.raises(dbqueue.ConfigurationError, match="no asyncio driver"):
            app.create_async_engine()
        return
    derived = app.create_async_engine()
    assert derived.dialect.is_async and derived.url.database == sa.engine.make_url(app.url).database
    monkeypatch.setenv("DBQUEUE_ASYNC_URL", derived.url.render_as_string(hide_password=False))
    configured = dbqueue.App(database.url, table_prefix=database.prefix)
    assert configured.settings.async_url == derived.url.render_as_string(hide_password=False)
    asyncio.run(derived.dispose())

"""Async handlers: what an ``async def`` handler is given and how one worker runs both kinds.

The per-pair guarantees (writes commit iff the job succeeds, retries, dead letters, SIGKILL,
exactly-once across processes, SIGTERM) run with async handlers in the parametrised contract
tests (``kind``); these are about the async worker itself, once per database.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import sqlalchemy as sa
import test_processes as processes
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from support.backends import PREFIX, backend_keys, database_keys, effects

import dbqueue


class Base(DeclarativeBase):
    pass


class Receipt(Base):
    __tablename__ = f"{PREFIX}receipts"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    note: Mapped[str] = mapped_column(sa.String(50))


def test_an_async_handler_writes_through_its_async_session_in_the_job_transaction(async_database):
    """``await session.execute``, ORM objects, ``commit()`` (a flush) and ``async with
    session.begin()``: all of it commits with the job, or not at all."""
    backend = async_database
    engine = backend.engine()
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    try:
        app = backend.app(max_attempts=1)

        @app.task("receipt")
        async def receipt(job: dbqueue.Job, session: AsyncSession) -> str:
            assert isinstance(session, AsyncSession)
            await session.execute(effects.insert().values(job_id=job.id, note="core"))
            session.add(Receipt(id=job.id, note="orm"))
            await session.commit()  # only flushes: the job's transaction is dbqueue's
            async with session.begin():
                seen = await session.scalar(sa.select(sa.func.count()).select_from(effects))
            await asyncio.sleep(0)
            if job.payload["fail"]:
                raise ValueError("after writing")
            return f"seen {seen}"

        good = app.enqueue(None, "receipt", {"fail": False})
        bad = app.enqueue(None, "receipt", {"fail": True})
        summary = backend.run_worker(app, batch_size=10)
        assert (summary.succeeded, summary.failed) == (1, 1)
        assert backend.effect_ids() == [good]
        with engine.connect() as conn:
            assert conn.execute(sa.select(Receipt.__table__.c.id)).scalars().all() == [good]
        assert app.get_job(good)["result"] == "seen 1"
        assert app.get_job(bad)["message"].startswith("ValueError: after writing")
    finally:
        Base.metadata.drop_all(engine)
        engine.dispose()


# Not a single-writer database (SQLite): its one write lock lets one batch run at a time.
@pytest.mark.parametrize(
    "async_database",
    database_keys(lambda spec: spec.has_async_driver and not spec.single_writer),
    indirect=True,
)
def test_one_worker_runs_async_handlers_on_its_loop_and_plain_ones_on_threads(async_database):
    """A plain handler that blocks its thread until an async handler has run proves the two
    kinds run side by side in one worker (concurrency 2): the plain one is not on the loop."""
    backend = async_database
    app = backend.app(max_attempts=1)
    released = threading.Event()
    where: dict[str, str] = {}

    @app.task("blocking", priority=1)
    def blocking(job, session):
        where["plain"] = threading.current_thread().name
        assert released.wait(60), "the async handler never ran while this one blocked"
        session.execute(effects.insert().values(job_id=job.id, note="plain"))

    @app.task("releasing", priority=2)
    async def releasing(job, session):
        where["async"] = threading.current_thread().name
        await session.execute(effects.insert().values(job_id=job.id, note="async"))
        released.set()

    ids = [app.enqueue(None, "blocking"), app.enqueue(None, "releasing")]
    summary = backend.run_worker(app, concurrency=2, batch_size=1)
    assert (summary.succeeded, summary.failed) == (2, 0)
    assert backend.effect_ids() == sorted(ids)
    assert where["async"] == "dbqueue-event-loop"
    assert where["plain"].startswith("dbqueue-slot-")


def test_an_async_handler_past_its_timeout_is_cancelled(async_database):
    backend = async_database
    app = backend.app(max_attempts=1)
    cancelled = []

    @app.task("slow", timeout=0.5)
    async def slow(job, session):
        await session.execute(effects.insert().values(job_id=job.id, note="rolled back"))
        try:
            await asyncio.sleep(120)
        except asyncio.CancelledError:
            cancelled.append(job.id)
            raise

    @app.task("quick")
    async def quick(job, session):
        await session.execute(effects.insert().values(job_id=job.id, note="kept"))

    slow_id = app.enqueue(None, "slow", priority=1)
    quick_id = app.enqueue(None, "quick", priority=2)
    summary = backend.run_worker(app, batch_size=10)
    assert (summary.succeeded, summary.failed) == (1, 1)
    assert cancelled == [slow_id]
    job = app.get_job(slow_id)
    assert job["status"] == "dead"
    assert job["message"].startswith("JobTimeoutError: job"), job["message"]
    assert backend.effect_ids() == [quick_id]  # the cancelled handler's write was rolled back


def test_an_async_handler_is_never_marked_done_without_running_in_eager_mode(async_database):
    """Eager mode runs handlers in the enqueuing thread, which has no loop to await one on:
    the job fails with the reason, it is not marked succeeded."""
    backend = async_database
    app = backend.app(max_attempts=1, eager=True)
    ran = []

    @app.task("a")
    async def a(job, session):
        ran.append(job.id)

    job_id = app.enqueue(None, "a")
    job = app.get_job(job_id)
    assert ran == []
    assert job["status"] == "dead"
    assert "async def" in job["message"] and "dbqueue worker" in job["message"]


def test_sigterm_lets_the_running_async_handler_finish_then_exits_zero(async_database, tmp_path):
    """The SIGTERM contract test, with the worker process's handler an async def."""
    processes.test_sigterm_finishes_the_running_job_then_exits_zero(
        async_database, tmp_path, "async"
    )


@pytest.mark.parametrize(
    "backend", backend_keys(lambda spec: not spec.has_async_driver), indirect=True
)
def test_a_database_without_an_asyncio_driver_refuses_async_handlers_at_start_up(backend):
    app = backend.app()

    @app.task("a")
    async def a(job, session):
        return None

    expected = f"{backend.dialect_class.name} has no asyncio driver"
    with pytest.raises(dbqueue.ConfigurationError, match=expected):
        backend.run_worker(app)

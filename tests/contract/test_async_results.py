"""``acall``, ``aresult`` and ``acancel`` against a real worker process, on every database: the
answers and errors of ``call``, ``result`` and ``cancel``, awaited — and the event loop runs
other tasks while a call waits (a job that only ends once another task of the loop has run)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession
from support.waiting import wait_for

import dbqueue

WORKER = Path(__file__).resolve().parents[1] / "support" / "async_calls_worker.py"
LONG = 120  # seconds a call may wait: a lost wake-up fails the test, it does not slow it


@contextlib.contextmanager
def worker_process(backend, log: Path) -> Iterator[subprocess.Popen]:
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), backend.url, backend.strategy, *backend.worker_args()],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: "concurrency 3" in log.read_text(), 60, "the worker to start", log)
        yield worker
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
        assert code == 0, log.read_text()[-3000:]


async def file_appears(path: Path) -> None:
    """Await ``path`` on the event loop (the worker process creates it)."""
    for _ in range(LONG * 50):
        if path.exists():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} did not appear")


def test_acall_waits_without_blocking_the_event_loop(database, tmp_path):
    """The job waits for a file that only a task of the caller's own loop creates, once the job
    has started: ``acall`` returns only if the loop ran that task while ``acall`` waited."""
    app = database.app()  # registers nothing: the worker process has the tasks
    started, release = tmp_path / "started", tmp_path / "release"
    ticks = 0

    async def other_task() -> None:
        nonlocal ticks
        while not started.exists():
            ticks += 1
            await asyncio.sleep(0.02)
        release.touch()

    async def scenario() -> object:
        other = asyncio.create_task(other_task())
        try:
            payload = {"started": str(started), "wait_file": str(release)}
            return await app.acall("wait_file", payload, timeout=LONG)
        finally:
            other.cancel()
            await app.adispose()

    with worker_process(database, tmp_path / "worker.log"):
        assert asyncio.run(scenario()) == "released"
    assert release.exists() and ticks > 0


def test_acall_and_aresult_return_results_and_raise_as_call_and_result_do(database, tmp_path):
    app = database.app()

    async def scenario() -> None:
        try:
            answer = await app.acall("add", {"a": 2, "b": 3}, timeout=LONG)
            assert answer["sum"] == 5 and answer["by"] == worker.pid
            with pytest.raises(dbqueue.JobFailedError) as dead:
                # The caller's App does not register "boom": its options are given here.
                await app.acall("boom", {"why": "out of paper"}, max_attempts=1, timeout=LONG)
            assert dead.value.last_error.startswith("RuntimeError: out of paper")

            job_id = await app.aenqueue(None, "add", {"a": 1, "b": 1})
            assert (await app.aresult(job_id, timeout=LONG))["sum"] == 2
            assert (await app.aresult(job_id))["sum"] == 2  # finished: no wait needed
            later = await app.aenqueue(None, "add", {"a": 0, "b": 0}, delay=3600)
            with pytest.raises(dbqueue.JobNotFinishedError, match="pass timeout=SECONDS"):
                await app.aresult(later)
            with pytest.raises(dbqueue.JobNotFinishedError, match="did not finish within 0.2 s"):
                await app.aresult(later, timeout=0.2)
            with pytest.raises(dbqueue.JobNotFoundError, match="there is no job 987654321"):
                await app.aresult(987654321)
        finally:
            await app.adispose()

    with worker_process(database, tmp_path / "worker.log") as worker:
        asyncio.run(scenario())


def test_acancel_cancels_waiting_jobs_and_asks_the_worker_to_stop_running_ones(database, tmp_path):
    app = database.app()

    async def scenario() -> None:
        try:
            later = await app.aenqueue(None, "add", {"a": 0, "b": 0}, delay=3600)
            kept = await app.aenqueue(None, "add", {"a": 0, "b": 0}, delay=3600)
            assert await app.acancel([later, 987654321]) == {
                later: "cancelled",
                987654321: "not found",
            }
            with pytest.raises(dbqueue.JobCancelledError):
                await app.aresult(later)
            if database.has_async_driver:  # in the caller's transaction: rolled back with it
                engine = app.create_async_engine()
                try:
                    async with AsyncSession(engine) as session, session.begin():
                        assert await app.acancel(kept, session) == {kept: "cancelled"}
                        await session.rollback()
                finally:
                    await engine.dispose()
                with pytest.raises(dbqueue.JobNotFinishedError):
                    await app.aresult(kept)  # still waiting
            running = await app.aenqueue(None, "cooperative", {"dir": str(tmp_path)})
            await file_appears(tmp_path / f"started-{running}")
            said = (await app.acancel(running))[running]
            if app.context.cancel_requests().separate:
                # SQLite: a job its batch holds looks waiting (see test_cancel.py).
                assert said in ("cancelled", "cancel requested"), said
            else:
                assert said == "cancel requested", said
            with pytest.raises(dbqueue.JobCancelledError):
                await app.aresult(running, timeout=LONG)
            assert (tmp_path / f"saw-{running}").exists()  # the handler saw the request
        finally:
            await app.adispose()

    with worker_process(database, tmp_path / "worker.log"):
        asyncio.run(scenario())


def test_the_readmes_async_calls_in_eager_mode(database):
    """The README's example (Results and synchronous calls), as written there; eager mode runs
    the job on a thread when ``acall`` enqueues it, so no worker is needed."""
    app = database.app(eager=True)

    @app.task("quote")
    def quote(job: dbqueue.Job, session) -> dict:
        return {"sku": job.payload["sku"], "price": 12.5}

    async def price_of(sku: str) -> float:
        answer = await app.acall("quote", {"sku": sku}, timeout=30)  # other tasks run meanwhile
        return answer["price"]

    async def quote_later(sku: str) -> dict:
        job_id = await app.aenqueue(None, "quote", {"sku": sku})
        answer = await app.aresult(job_id, timeout=10)  # {"price": 12.5, "sku": sku}
        assert await app.acancel([job_id]) == {job_id: "already succeeded"}
        return answer

    async def scenario() -> tuple[float, dict]:
        try:
            return await price_of("A1"), await quote_later("B2")
        finally:
            await app.adispose()

    assert asyncio.run(scenario()) == (12.5, {"sku": "B2", "price": 12.5})

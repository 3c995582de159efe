"""The README's FastAPI example, for real: a FastAPI app served by uvicorn (a real ASGI server, on
a loopback socket, in a thread of the test) whose endpoint saves an order and enqueues its
invoice with ``aenqueue`` inside its ``AsyncSession`` transaction; a dbqueue worker runs the job.

The job exists once the endpoint's transaction commits, not at all when the endpoint fails
after enqueueing, and the worker's handler sees the order the endpoint wrote.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import requests
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from support.backends import PREFIX

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

pytestmark = pytest.mark.parametrize("database", ["postgresql", "mysql", "sqlite"], indirect=True)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = f"{PREFIX}api_orders"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    invoiced: Mapped[bool] = mapped_column(default=False)


def build_api(queue):
    """The README's example: an endpoint that enqueues in its AsyncSession's transaction."""
    engine = queue.create_async_engine()
    sessions = async_sessionmaker(engine, expire_on_commit=False)

    @contextlib.asynccontextmanager
    async def lifespan(api) -> AsyncIterator[None]:
        yield
        await engine.dispose()
        await queue.adispose()

    api = fastapi.FastAPI(lifespan=lifespan)

    async def get_session() -> AsyncIterator[AsyncSession]:
        async with sessions() as session:
            yield session

    @api.post("/orders/{order_id}")
    async def create_order(
        order_id: int, fail: bool = False, session: AsyncSession = fastapi.Depends(get_session)
    ) -> dict[str, int]:
        async with session.begin():
            session.add(Order(id=order_id))
            job_id = await queue.aenqueue(session, "invoice_order", {"order": order_id})
            if fail:
                raise fastapi.HTTPException(500, "failed after enqueueing")
        return {"job": job_id}

    return api


@contextlib.contextmanager
def serving(api) -> Iterator[str]:
    """uvicorn serving ``api`` on a free loopback port; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(api, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        assert not thread.is_alive()


@pytest.fixture
def queue(database):
    queue = database.app()
    Order.__table__.drop(queue.engine, checkfirst=True)
    Order.__table__.create(queue.engine)
    yield queue
    Order.__table__.drop(queue.engine)
    queue.engine.dispose()


def test_an_endpoint_enqueues_in_its_async_session_and_a_worker_runs_the_job(database, queue):
    ran = []

    @queue.task("invoice_order")
    def invoice_order(job, session):
        order = session.get(Order, job.payload["order"])
        order.invoiced = True  # the endpoint's row: committed with the job
        ran.append(job.id)

    with serving(build_api(queue)) as base:
        created = requests.post(f"{base}/orders/1", timeout=30)
        failed = requests.post(f"{base}/orders/2", params={"fail": "true"}, timeout=30)

    assert created.status_code == 200, created.text
    assert failed.status_code == 500
    job_id = created.json()["job"]
    assert [(j["id"], j["task"], j["payload"]) for j in database.jobs()] == [
        (job_id, "invoice_order", {"order": 1})
    ]
    summary = database.run_worker(queue)
    assert summary.succeeded == 1 and ran == [job_id]
    with queue.engine.connect() as conn:
        rows = conn.execute(sa.select(Order.id, Order.invoiced)).all()
    assert [tuple(row) for row in rows] == [(1, True)]  # order 2 rolled back with its job

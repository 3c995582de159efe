"""The async client API (``aenqueue``, ``aenqueue_many``, ``apublish``, ``apublish_webhook``): the
same Writes as the sync calls (``dbqueue.app.writes``), run on an AsyncConnection through
``run_sync``. Only where the connection comes from, and how it is awaited, is written here.

SQLAlchemy's asyncio layer is imported on first use: ``dbqueue-sql[asyncio]`` is an optional extra.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session, scoped_session

from dbqueue import dialects
from dbqueue.app.writes import ClientWrites, Write, Written
from dbqueue.base.distribution import install_hint
from dbqueue.errors import ConfigurationError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from dbqueue.app.eager import AfterCommit
    from dbqueue.runtime.context import RuntimeContext

#: What the async calls write through: an AsyncSession (or an async_scoped_session), an
#: AsyncConnection, an AsyncEngine, or None (a short transaction of dbqueue's own).
AsyncTarget = Any


def _asyncio_module() -> Any:
    try:
        from sqlalchemy.ext import asyncio as sa_asyncio
    except ImportError as exc:  # pragma: no cover - greenlet missing
        raise ConfigurationError(
            f"the async API needs SQLAlchemy's asyncio support ({exc}): {install_hint('asyncio')}"
        ) from None
    return sa_asyncio


@contextlib.asynccontextmanager
async def async_connection_for(
    context: RuntimeContext, call: str, target: AsyncTarget, reads_first: bool
) -> AsyncIterator[tuple[AsyncConnection, Any]]:
    """An AsyncConnection inside the caller's transaction (or a fresh one of dbqueue's own),
    with the sync object whose commit the wake-ups follow (None: committed on exit)."""
    sa_asyncio = _asyncio_module()
    if isinstance(target, sa_asyncio.async_scoped_session):
        target = target()
    if isinstance(target, sa_asyncio.AsyncSession):
        yield await target.connection(), target.sync_session
    elif isinstance(target, sa_asyncio.AsyncConnection):
        yield target, target.sync_connection
    elif target is None or isinstance(target, sa_asyncio.AsyncEngine):
        engine: AsyncEngine = context.async_engine() if target is None else target
        if reads_first:
            engine = engine.execution_options(**{dialects.WRITE_INTENT: True})
        async with engine.begin() as conn:
            yield conn, None
    else:
        raise TypeError(_wrong_target(call, target))


def _wrong_target(call: str, target: Any) -> str:
    kind = type(target).__name__
    if isinstance(target, (Session, scoped_session, Connection, Engine)):
        return (
            f"{call}() got a sync {kind}: pass an AsyncSession or AsyncConnection (the job joins "
            f"its transaction) or None, or call app.{call[1:]}() with the {kind}"
        )
    return (
        f"cannot {call}() through {kind}: pass a SQLAlchemy AsyncSession or AsyncConnection "
        "(the job joins its transaction) or None (dbqueue commits at once)"
    )


class AsyncWrites:
    """The async job-creating calls: the sync calls' Writes, awaited."""

    def __init__(
        self, context: RuntimeContext, writes: ClientWrites, after_commit: AfterCommit
    ) -> None:
        self.context = context
        self._writes = writes
        self._after_commit = after_commit

    async def aenqueue(
        self, target: AsyncTarget, task: str, payload: Any, options: Mapping[str, Any]
    ) -> int:
        """``enqueue`` for asyncio: insert one job in ``target``'s transaction (an
        AsyncSession or AsyncConnection: the job commits or rolls back with the caller's work;
        None: dbqueue commits at once) and return its id."""
        write = self._writes.enqueue_write("aenqueue", task, payload, options)
        return await self._awrite("aenqueue", target, write)

    async def aenqueue_many(
        self, target: AsyncTarget, jobs: Iterable[Mapping[str, Any]]
    ) -> list[int]:
        """``enqueue_many`` for asyncio: many jobs in few statements, all validated first."""
        write = self._writes.enqueue_many_write("aenqueue_many", jobs)
        return await self._awrite("aenqueue_many", target, write)

    async def apublish(
        self, target: AsyncTarget, topic: str, payload: Any, options: Mapping[str, Any]
    ) -> int:
        """``publish`` for asyncio; returns the publication id."""
        write = self._writes.publish_write("apublish", topic, payload, options, False)
        return await self._awrite("apublish", target, write)

    async def apublish_webhook(
        self, target: AsyncTarget, topic: str, payload: Any, options: Mapping[str, Any]
    ) -> int:
        """``publish_webhook`` for asyncio."""
        write = self._writes.publish_write("apublish_webhook", topic, payload, options, True)
        return await self._awrite("apublish_webhook", target, write)

    async def adispose(self) -> None:
        """Close the connections of dbqueue's own asyncio engine in the running event loop
        (at shutdown, e.g. in FastAPI's lifespan): they belong to that loop, and would
        otherwise be closed after it, with warnings."""
        engine = self.context.forget_async_engine()
        if engine is not None:
            await engine.dispose()

    async def _awrite(self, call: str, target: AsyncTarget, write: Write) -> Any:
        if write.is_empty:
            return []
        if target is None and not self.context.has_async_driver:
            # No asyncio driver for this database (SingleStore): dbqueue's own short
            # transaction runs the sync path on a thread, so the event loop is not blocked.
            return await asyncio.to_thread(self._writes.execute, None, write)
        async with async_connection_for(self.context, call, target, write.reads_first) as (
            conn,
            committed_by,
        ):
            done: Written = await conn.run_sync(write.run)
        if done.queues:
            self._after_commit.enqueued(committed_by, done.queues, done.ids)
        return done.value

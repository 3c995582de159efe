"""The AsyncSession an ``async def`` handler receives (needs ``dbqueue-sql[asyncio]``: imported only
by an async worker, since SQLAlchemy's asyncio module requires greenlet)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from dbqueue.worker.session import JobSession


class _AsyncFlushOnExit:
    """``async with session.begin():`` in an async handler: flush on success, nothing else."""

    def __init__(self, session: AsyncJobSession) -> None:
        self.session = session

    async def __aenter__(self) -> AsyncJobSession:
        return self.session

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            await self.session.flush()


class AsyncJobSession(AsyncSession):
    """What an ``async def`` handler receives: an AsyncSession over the slot's connection, in
    the transaction that holds the job's claim, with a JobSession inside (a savepoint per job,
    ``commit()`` only flushes, ``close()`` is ignored): its writes commit if and only if the job
    is marked succeeded."""

    def __init__(
        self, connection: AsyncConnection, savepoint: bool = True, own_transaction: bool = False
    ) -> None:
        super().__init__(
            bind=connection,
            sync_session_class=lambda bind, binds=None, **kw: JobSession(
                bind, savepoint, own_transaction
            ),
        )
        self.own_transaction = own_transaction

    def begin(self) -> Any:  # type: ignore[override]
        if self.own_transaction:  # outside the claim's transaction: the handler's own
            return super().begin()
        return _AsyncFlushOnExit(self)

    # ---- called by the worker (from the slot's greenlet, where I/O may run synchronously) ----
    def keep(self) -> None:
        self.sync_session.keep()  # type: ignore[attr-defined]

    def discard(self) -> None:
        self.sync_session.discard()  # type: ignore[attr-defined]

    @property
    def bind(self) -> Any:
        """The sync Connection underneath (the executor looks at whether it broke)."""
        return self.sync_session.bind

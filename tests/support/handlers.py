"""Handlers of both kinds from one body: a contract test written once runs with a plain ``def``
handler and with an ``async def`` one (which an async worker awaits on its event loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession

#: The ``kind`` parameter of the tests that run with both kinds of handlers.
KINDS = pytest.mark.parametrize("kind", ["sync", "async"])


def handler(kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``@app.task(...)`` above ``@handler(kind)`` above ``def body(job, session)``: for
    ``async``, an ``async def`` that yields to the loop, then runs the body on its
    AsyncSession's Session (``run_sync``): the same statements, in the same transaction."""

    def wrap(body: Callable[..., Any]) -> Callable[..., Any]:
        if kind == "sync":
            return body

        async def async_handler(job: Any, session: AsyncSession) -> Any:
            assert isinstance(session, AsyncSession), type(session)
            await asyncio.sleep(0)
            return await session.run_sync(lambda sync_session: body(job, sync_session))

        async_handler.__name__ = body.__name__
        return async_handler

    return wrap

"""Registration: which handlers a worker runs on its event loop (no database needed)."""

from __future__ import annotations

import functools

import pytest

import dbqueue


async def async_handler(job, session):
    return None


class AsyncCallable:
    async def __call__(self, job, session):
        return None


ASYNC_HANDLERS = [
    pytest.param(async_handler, id="async-def"),
    pytest.param(functools.partial(async_handler), id="partial-of-async"),
    pytest.param(AsyncCallable(), id="async-__call__"),
]


def app() -> dbqueue.App:
    return dbqueue.App("sqlite:///unused-by-these-tests.db")


@pytest.mark.parametrize("handler", ASYNC_HANDLERS)
def test_async_handlers_are_accepted_and_turn_the_worker_async(handler):
    """Every kind of handler may be an async def (a coroutine function, a partial of one, an
    object with an async __call__): the registry says so, and a worker then runs on a loop."""
    queue = app()
    assert not queue.registry.has_async_handlers()
    queue.task("a")(handler)
    assert queue.registry.get("a").handler is handler
    assert queue.registry.has_async_handlers()
    for register in (
        lambda q: q.dead_handler("b")(handler),
        lambda q: q.subscriber("t", "sub")(handler),
        lambda q: q.dead_subscriber("t", "sub2")(handler),
        lambda q: q.task("c", dead_handler=handler)(lambda job, session: None),
    ):
        other = app()
        register(other)
        assert other.registry.has_async_handlers()


def test_plain_handlers_are_accepted():
    queue = app()

    @queue.task("fine")
    def fine(job, session):
        return None

    assert queue.registry.get("fine").handler is fine

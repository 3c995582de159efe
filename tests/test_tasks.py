"""Registration refuses what a worker could not run (no database needed: nothing is enqueued)."""

from __future__ import annotations

import functools

import pytest

import dbqueue


async def async_handler(job, session):
    return "never runs in a worker thread"


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
def test_an_async_task_handler_is_refused_at_registration(handler):
    queue = app()
    with pytest.raises(dbqueue.ConfigurationError, match="is an async def function") as caught:
        queue.task("refused")(handler)
    assert "make it a plain def" in str(caught.value)
    assert queue.registry.get("refused") is None


@pytest.mark.parametrize("handler", ASYNC_HANDLERS)
def test_async_dead_handlers_and_subscribers_are_refused(handler):
    queue = app()
    with pytest.raises(dbqueue.ConfigurationError, match="dead handler of task 'a'"):
        queue.dead_handler("a")(handler)
    with pytest.raises(dbqueue.ConfigurationError, match="subscriber 'sub' of topic 't'"):
        queue.subscriber("t", "sub")(handler)
    with pytest.raises(dbqueue.ConfigurationError, match="dead handler of subscriber 'sub'"):
        queue.dead_subscriber("t", "sub")(handler)
    with pytest.raises(dbqueue.ConfigurationError, match="dead handler of task 'b'"):
        queue.task("b", dead_handler=handler)(lambda job, session: None)


def test_plain_handlers_are_accepted():
    queue = app()

    @queue.task("fine")
    def fine(job, session):
        return None

    assert queue.registry.get("fine").handler is fine

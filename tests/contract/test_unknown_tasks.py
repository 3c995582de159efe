"""A task name the App does not register: an enqueue warns once per name, with the registered
names it is close to, and still enqueues (a worker of another App may register it); an App that
registers no task (a producer's) is never warned; ``app.call`` refuses at once, enqueueing
nothing, instead of waiting its whole timeout. On every database."""

from __future__ import annotations

import asyncio
import warnings

import pytest

import dbqueue


def _thumbnail_app(backend) -> dbqueue.App:
    app = backend.app()

    @app.task
    def thumbnail(job, session):
        return "small"

    @app.task
    def resize(job, session):
        return "resized"

    return app


def _caught(calls) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calls()
    return [str(w.message) for w in caught if issubclass(w.category, dbqueue.UnknownTaskWarning)]


def test_a_misspelt_task_warns_once_per_name_and_is_still_enqueued(database):
    app = _thumbnail_app(database)

    def enqueues() -> None:
        app.enqueue(None, "thumbnial", {"n": 1})
        app.enqueue(None, "thumbnial", {"n": 2}, priority=3)  # the options' path too
        app.enqueue_many(None, [{"task": "thumbnial"}, {"task": "sizes", "priority": 1}])
        app.enqueue(None, "thumbnail")  # registered: no warning
        app.enqueue(None, "sizes")

    said = _caught(enqueues)
    assert said == [
        "this App registers no task 'thumbnial' (did you mean 'thumbnail'?); the job is queued "
        "for a worker whose App registers it (any other fails it as an unknown task)",
        "this App registers no task 'sizes' (did you mean 'resize'?); the job is queued for a "
        "worker whose App registers it (any other fails it as an unknown task)",
    ]
    assert (
        sorted(j["task"] for j in database.jobs())
        == ["sizes"] * 2 + ["thumbnail"] + ["thumbnial"] * 3
    )
    # Once per name and App: another App warns again.
    assert len(_caught(lambda: _thumbnail_app(database).enqueue(None, "thumbnial"))) == 1


def test_a_name_close_to_nothing_lists_the_registered_ones(database):
    app = _thumbnail_app(database)

    async def enqueue() -> None:
        try:
            await app.aenqueue(None, "send_invoice")
        finally:
            await app.adispose()

    said = _caught(lambda: asyncio.run(enqueue()))
    assert said == [
        "this App registers no task 'send_invoice' (it registers 'resize', 'thumbnail'); the "
        "job is queued for a worker whose App registers it (any other fails it as an unknown "
        "task)"
    ]


def test_the_warning_names_the_callers_line_and_can_be_made_an_error(database):
    app = _thumbnail_app(database)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        app.enqueue(None, "thumbnial")
    assert caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error", dbqueue.UnknownTaskWarning)
        with pytest.raises(dbqueue.UnknownTaskWarning, match="did you mean 'thumbnail'"):
            _thumbnail_app(database).enqueue(None, "thumbnial")


def test_a_producers_app_that_registers_nothing_is_never_warned(database):
    app = database.app()
    assert _caught(lambda: app.enqueue(None, "thumbnial")) == []
    assert [j["task"] for j in database.jobs()] == ["thumbnial"]


def test_call_of_an_unregistered_task_fails_at_once_and_enqueues_nothing(database):
    app = _thumbnail_app(database)
    # An hour's timeout: a call that waited would fail the test by its own time limit.
    with pytest.raises(dbqueue.UnknownTaskError) as refused:
        app.call("thumbnial", {"n": 1}, timeout=3600)
    assert str(refused.value) == (
        "app.call('thumbnial'): this App registers no task 'thumbnial' (did you mean "
        "'thumbnail'?). Nothing was enqueued: fix the name, or register the task on the App "
        "you call it through"
    )
    with pytest.raises(dbqueue.UnknownTaskError, match=r"^app.acall\('thumbnial'\): "):
        asyncio.run(app.acall("thumbnial", timeout=3600))
    assert database.jobs() == []

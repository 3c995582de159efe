"""A handler that cannot take what the worker will call it with is refused when it is
registered, in one line naming the shape it needs; every shape that can take it is accepted
(functools.partial, bound methods, callable objects, ``*args``, ``async def``). Nothing here
connects: registration never does."""

from __future__ import annotations

import functools

import pytest

import dbqueue


@pytest.fixture
def app() -> dbqueue.App:
    return dbqueue.App("sqlite://")


class Handlers:
    def method(self, job, session):
        return job

    def __call__(self, job, session):
        return job


class Hooks:
    def stopped(self, worker):
        return worker


class AsyncCallable:
    async def __call__(self, job, session):
        return job


def two(job, session):
    return job


def with_tenant(job, session, tenant_session):
    return job


async def async_two(job, session):
    return job


def three_with_prefix(prefix, job, session):
    return prefix


def varargs(*args):
    return args


def defaults(job, session, extra=None, *, flag=False):
    return job


GOOD_TASK_HANDLERS = {
    "function": two,
    "async def": async_two,
    "partial": functools.partial(three_with_prefix, "p"),
    "bound method": Handlers().method,
    "callable object": Handlers(),
    "async callable object": AsyncCallable(),
    "*args": varargs,
    "defaults and optional keywords": defaults,
    "lambda": lambda job, session: None,
    "builtin without a readable signature": print,
}


def one_arg(job):
    return job


def needs_keyword(job, session, *, required):
    return job


BAD_TASK_HANDLERS = {
    "one argument": (one_arg, "one_arg(job) cannot be called with (job, session)"),
    "none": (lambda: None, "<lambda>() cannot be called with (job, session)"),
    "three": (with_tenant, "with_tenant(job, session, tenant_session) cannot be called with"),
    "a required keyword": (needs_keyword, "missing a required argument: 'required'"),
    "a partial that binds too much": (
        functools.partial(two, 1, 2),
        "two() cannot be called with (job, session)",
    ),
}


@pytest.mark.parametrize("handler", GOOD_TASK_HANDLERS.values(), ids=GOOD_TASK_HANDLERS)
def test_every_shape_that_takes_job_and_session_is_accepted_everywhere(app, handler):
    app.task("t")(handler)
    app.dead_handler("t")(handler)
    app.subscriber("topic", "sub")(handler)
    app.dead_subscriber("topic", "sub")(handler)
    app.batch_task("b")(handler)
    assert app.registry.get("t").handler is handler
    assert app.registry.get("t").dead_handler is handler
    assert app.registry.subscriber("topic", "sub").handler is handler
    assert app.registry.get("b").handler is handler


@pytest.mark.parametrize("handler, said", BAD_TASK_HANDLERS.values(), ids=BAD_TASK_HANDLERS)
def test_a_task_handler_of_the_wrong_shape_is_refused_in_one_line(app, handler, said):
    with pytest.raises(dbqueue.ConfigurationError) as refused:
        app.task("t")(handler)
    line = str(refused.value)
    assert line.startswith("task 't': ") and said in line, line
    assert line.endswith("declare its parameters as (job, session)"), line
    assert "\n" not in line
    assert app.registry.get("t") is None  # nothing was registered


def test_the_issues_one_argument_handler_names_the_fix(app):
    with pytest.raises(dbqueue.ConfigurationError) as refused:

        @app.task
        def thumbnail(job):
            return None

    assert str(refused.value) == (
        "task 'thumbnail': test_the_issues_one_argument_handler_names_the_fix.<locals>."
        "thumbnail(job) cannot be called with (job, session) (too many positional arguments): "
        "declare its parameters as (job, session)"
    )


@pytest.mark.parametrize(
    "register, what, shape",
    [
        (lambda app, h: app.dead_handler("t")(h), "dead handler of task 't'", "(job, session)"),
        (
            lambda app, h: app.task("t", dead_handler=h)(two),
            "dead handler of task 't'",
            "(job, session)",
        ),
        (
            lambda app, h: app.subscriber("topic", "sub")(h),
            "subscriber 'sub' of topic 'topic'",
            "(job, session)",
        ),
        (
            lambda app, h: app.dead_subscriber("topic", "sub")(h),
            "dead subscriber 'sub' of topic 'topic'",
            "(job, session)",
        ),
        (lambda app, h: app.batch_task("b")(h), "task 'b'", "(jobs, session)"),
        (lambda app, h: app.middleware(h), "app.middleware", "(job, call_next)"),
        (lambda app, h: app.on_worker_error(h), "@app.on_worker_error", "(exc, worker)"),
    ],
    ids=[
        "dead handler",
        "dead_handler option",
        "subscriber",
        "dead subscriber",
        "batch task",
        "middleware",
        "error hook",
    ],
)
def test_every_kind_refuses_a_one_argument_function(app, register, what, shape):
    with pytest.raises(dbqueue.ConfigurationError) as refused:
        register(app, one_arg)
    line = str(refused.value)
    assert line.startswith(f"{what}: one_arg(job) cannot be called with {shape}"), line
    assert line.endswith(f"declare its parameters as {shape}"), line


def test_tenant_handlers_take_the_tenant_session_too(app):
    app.task("t", tenant_database=True)(with_tenant)
    app.dead_handler("t", tenant_database=True)(with_tenant)
    app.dead_subscriber("topic", "sub", tenant_database=True)(with_tenant)
    app.task("v", tenant_database=True)(varargs)
    with pytest.raises(dbqueue.ConfigurationError) as refused:
        app.task("u", tenant_database=True)(two)
    assert str(refused.value) == (
        "task 'u': two(job, session) cannot be called with (job, session, tenant_session) "
        "(too many positional arguments): declare its parameters as "
        "(job, session, tenant_session)"
    )
    with pytest.raises(dbqueue.ConfigurationError, match="dead subscriber 'sub' of topic 'x'"):
        app.dead_subscriber("x", "sub", tenant_database=True)(two)


def test_worker_hooks_take_the_worker(app):
    app.on_worker_start(lambda worker: None)
    app.on_worker_stop(Hooks().stopped)
    app.middleware(lambda job, call_next: call_next())
    app.on_worker_error(lambda exc, worker: None)
    for register, name in ((app.on_worker_start, "start"), (app.on_worker_stop, "stop")):
        with pytest.raises(dbqueue.ConfigurationError) as refused:
            register(two)
        assert str(refused.value).startswith(
            f"@app.on_worker_{name}: two(job, session) cannot be called with (worker)"
        )
    with pytest.raises(dbqueue.ConfigurationError, match="takes a function, not int"):
        app.middleware(3)


def test_a_bare_decorator_registers_the_function_under_its_name(app):
    @app.task
    def thumbnail(job, session):
        return "done"

    @app.batch_task
    def thumbnails(jobs, session):
        return None

    assert thumbnail(None, None) == "done"  # the function itself, not a decorator
    assert app.registry.get("thumbnail").handler is thumbnail
    assert app.registry.get("thumbnails").batch is not None

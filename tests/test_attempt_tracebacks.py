"""A failed attempt's traceback, trimmed to the handler's own frames (no database: the contract
test ``tests/contract/test_attempt_errors.py`` proves it on real workers)."""

from __future__ import annotations

import json
from typing import Any

from dbqueue.tasks import failures
from dbqueue.tasks.failures import AttemptError, attempt_error, handler_traceback


def machinery(module: str) -> Any:
    """A function ``call(fn)`` whose frame runs in ``module``, as the worker's plumbing does."""
    namespace: dict[str, Any] = {"__name__": module}
    exec("def call(fn):\n    return fn()\n", namespace)
    return namespace["call"]


def raised(call: Any) -> BaseException:
    try:
        call()
    except BaseException as exc:  # the worker catches everything a handler raises
        return exc
    raise AssertionError("nothing raised")


def handler() -> None:
    raise LookupError("order 42 not found")


def test_only_the_handlers_frames_remain_around_and_inside_the_machinery() -> None:
    layers = [
        "dbqueue.worker.handlers",
        "concurrent.futures._base",
        "asyncio.tasks",
        "greenlet",
        "sqlalchemy.util._concurrency_py3k",
        "dbqueue.tasks.hooks",
    ]

    def middleware() -> None:  # the user's own middleware: kept
        machinery("dbqueue.worker.handlers")(handler)

    def through(index: int) -> Any:
        if index == len(layers):
            return middleware()
        return machinery(layers[index])(lambda: through(index + 1))

    trace = handler_traceback(raised(lambda: through(0)))
    assert trace is not None
    functions = [line.split(", in ")[1] for line in trace.splitlines() if ", in " in line]
    # The lambdas are this test's frames (user code too); no frame of a machinery module.
    assert "call" not in functions
    assert functions[-2:] == ["middleware", "handler"]
    assert trace.endswith("LookupError: order 42 not found")


def test_the_chain_keeps_each_exceptions_handler_frames() -> None:
    def cleanup_fails() -> None:
        try:
            handler()
        except LookupError:
            raise RuntimeError("rollback failed")  # noqa: B904 - an implicit context

    trace = handler_traceback(raised(lambda: machinery("dbqueue.x")(cleanup_fails)))
    assert trace is not None
    first, second = trace.split("During handling of the above exception")
    assert "in handler" in first and "LookupError" in first
    assert "in cleanup_fails" in second and second.endswith("RuntimeError: rollback failed")

    def suppressed() -> None:
        try:
            handler()
        except LookupError:
            raise RuntimeError("plain") from None

    trace = handler_traceback(raised(suppressed))
    assert trace is not None and "LookupError" not in trace


def test_no_handler_frame_means_no_traceback() -> None:
    namespace: dict[str, Any] = {"__name__": "dbqueue.worker.handlers"}
    exec(
        "def catch(fn):\n    try:\n        fn()\n    except BaseException as exc:\n"
        "        return exc\n"
        "def refuse():\n    raise TypeError('the batch handler returned a list')\n",
        namespace,
    )
    exc = namespace["catch"](namespace["refuse"])  # raised and caught inside dbqueue
    assert isinstance(exc, TypeError)
    assert handler_traceback(exc) is None
    assert attempt_error(exc) == AttemptError("TypeError: the batch handler returned a list")


def test_deep_recursion_keeps_the_innermost_frames() -> None:
    def ping(n: int) -> None:  # two functions in turn: Python would fold one repeated line
        if n == 0:
            raise RecursionError("too deep")
        pong(n - 1)

    def pong(n: int) -> None:
        ping(n - 1)

    trace = handler_traceback(raised(lambda: ping(200)))
    assert trace is not None
    assert trace.count(", in ping") + trace.count(", in pong") == failures.MAX_FRAMES
    assert trace.endswith("RecursionError: too deep")


def test_an_entry_is_json_with_its_message_and_traceback_clipped() -> None:
    long = AttemptError("x" * 10_000, "Traceback…\n" + "y" * 10_000 + "\nValueError: end")
    entry = json.loads(long.entry(7))
    assert entry["attempt"] == 7
    assert len(entry["message"]) <= failures.MAX_ERROR_MESSAGE_CHARS
    assert len(entry["traceback"]) <= failures.MAX_TRACEBACK_CHARS
    assert entry["traceback"].endswith("ValueError: end")  # the innermost part is kept
    assert "\n" not in AttemptError("a\nb").entry(1)  # one line of JSON (SingleStore's list)
    assert json.loads(AttemptError("worker died").entry(2))["traceback"] is None

"""Whether a function can take the arguments dbqueue will call it with, checked when it is
registered: a handler declared ``def handle(job)`` would otherwise be accepted, and fail every
attempt of every job of its task with a TypeError, far from the line that declared it."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from dbqueue.errors import ConfigurationError

#: What each kind of registered function is called with (the names in the messages).
TASK = ("job", "session")
TENANT_TASK = ("job", "session", "tenant_session")
BATCH = ("jobs", "session")
MIDDLEWARE = ("job", "call_next")
WORKER_HOOK = ("worker",)
ERROR_HOOK = ("exc", "worker")


def check_signature(fn: Any, what: str, arguments: tuple[str, ...]) -> None:
    """Refuse ``fn`` (registered as ``what``) unless it accepts ``len(arguments)`` positional
    arguments. A callable whose signature cannot be read (some builtins) is trusted; partials,
    bound methods, callable objects, ``*args`` and ``async def`` are read like functions."""
    shape = f"({', '.join(arguments)})"
    if not callable(fn):
        raise ConfigurationError(f"{what}: {fn!r} is not callable: pass a function taking {shape}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*arguments)
    except TypeError as exc:
        raise ConfigurationError(
            f"{what}: {_name(fn)}{signature} cannot be called with {shape} ({exc}): "
            f"declare its parameters as {shape}"
        ) from None


def _name(fn: Any) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__

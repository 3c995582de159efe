"""A task name the App does not register, at enqueue or call time: most likely a misspelt one,
said with the registered names it is close to.

An enqueue only warns, once per name and App: the job may be meant for a worker whose App
registers other tasks (a producer's App registers none, and is never warned). ``app.call``
refuses at once: it would wait its whole timeout for a job no worker of this App can run.
"""

from __future__ import annotations

import difflib
import os
import sys
import threading
import warnings
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from dbqueue.errors import UnknownTaskError, UnknownTaskWarning

if TYPE_CHECKING:
    from dbqueue.tasks.registry import TaskRegistry

#: Registry → the names already warned about (a registry lives as long as its App).
_WARNED: weakref.WeakKeyDictionary[TaskRegistry, set[str]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_PACKAGE = str(Path(__file__).resolve().parent.parent) + os.sep


def not_registered(registry: TaskRegistry, task: str) -> str | None:
    """What is wrong with ``task`` for this registry; None when it registers the task, handles
    every name (a catch-all), or registers no task at all."""
    names = registry.names()
    if not names or task in names or registry.catch_all is not None:
        return None
    close = difflib.get_close_matches(task, names, n=3)
    if close:
        return (
            f"this App registers no task {task!r} (did you mean {' or '.join(map(repr, close))}?)"
        )
    shown = ", ".join(map(repr, names[:10])) + (", …" if len(names) > 10 else "")
    return f"this App registers no task {task!r} (it registers {shown})"


def warn_unregistered(registry: TaskRegistry, task: str) -> None:
    """Warn (UnknownTaskWarning), once per name, of an enqueue of a task not registered here.
    A name already warned about costs a set lookup: the suggestions are worked out once."""
    with _LOCK:
        warned = _WARNED.setdefault(registry, set())
        if task in warned:
            return
    problem = not_registered(registry, task)
    if problem is None:
        return
    with _LOCK:
        if task in warned:
            return
        warned.add(task)
    warnings.warn(
        f"{problem}; the job is queued for a worker whose App registers it (any other fails "
        "it as an unknown task)",
        UnknownTaskWarning,
        stacklevel=_callers_level(),
    )


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside dbqueue: the warning names the caller's
    line, whichever path the enqueue took inside."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def refuse_unregistered(registry: TaskRegistry, call: str, task: str) -> None:
    """``app.call`` of a task not registered here: UnknownTaskError at once, nothing enqueued."""
    problem = not_registered(registry, task)
    if problem is not None:
        raise UnknownTaskError(
            f"{call}({task!r}): {problem}. Nothing was enqueued: fix the name, or register "
            "the task on the App you call it through"
        )

"""Middlewares around handlers and the worker's lifecycle hooks (``app.middleware``,
``@app.on_worker_start`` / ``on_worker_stop`` / ``on_worker_error``), kept in the task registry
so that every worker and eager runner built from the App sees the same ones."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dbqueue.errors import ConfigurationError
from dbqueue.tasks.signatures import ERROR_HOOK, MIDDLEWARE, WORKER_HOOK, check_signature

log = logging.getLogger("dbqueue.worker")

#: Each kind of hook: how it is registered, and what it is called with.
_KINDS = {
    "middlewares": ("app.middleware", MIDDLEWARE),
    "on_start": ("@app.on_worker_start", WORKER_HOOK),
    "on_stop": ("@app.on_worker_stop", WORKER_HOOK),
    "on_error": ("@app.on_worker_error", ERROR_HOOK),
}

#: ``fn(subject, call_next)``: subject is the Job (or, for a batch handler, the list of Jobs);
#: ``call_next()`` runs the next middleware, then the handler, and returns what it returned.
Middleware = Callable[[Any, Callable[[], Any]], Any]


class WorkerHooks:
    """What the App registered around its handlers and its workers."""

    def __init__(self) -> None:
        self.middlewares: list[Middleware] = []
        self.on_start: list[Callable[[Any], Any]] = []
        self.on_stop: list[Callable[[Any], Any]] = []
        self.on_error: list[Callable[[BaseException, Any], Any]] = []

    def add(self, kind: str, fn: Any) -> Any:
        if not callable(fn):
            raise ConfigurationError(
                f"{kind} takes a function, not {type(fn).__name__} {fn!r}: pass the function "
                "itself (no call parentheses)"
            )
        check_signature(fn, *_KINDS[kind])
        getattr(self, kind).append(fn)
        return fn

    def wrap(self, subject: Any, call: Callable[[], Any]) -> Callable[[], Any]:
        """``call`` inside the middlewares, the first registered outermost. Without any, the
        call itself: nothing is added to a job's run."""
        for middleware in reversed(self.middlewares):
            call = _bound(middleware, subject, call)
        return call

    def worker_started(self, worker: Any) -> None:
        """Run the start hooks in order; one that raises stops the worker from starting."""
        for hook in self.on_start:
            hook(worker)

    def worker_stopped(self, worker: Any) -> None:
        """Run every stop hook, in reverse order; one that raises is reported, not fatal."""
        for hook in reversed(self.on_stop):
            try:
                hook(worker)
            except Exception as exc:
                log.exception("an on_worker_stop hook raised")
                self.report(exc, worker)

    def report(self, exc: BaseException, worker: Any) -> None:
        """An error that escaped every handler (the worker loop's, a thread's, start-up's):
        tell the error hooks; a hook that raises is only logged."""
        for hook in self.on_error:
            try:
                hook(exc, worker)
            except Exception:
                log.exception("an on_worker_error hook raised")


def _bound(middleware: Middleware, subject: Any, call_next: Callable[[], Any]) -> Callable[[], Any]:
    return lambda: middleware(subject, call_next)

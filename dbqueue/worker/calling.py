"""How the executor calls a handler: a plain one here or on an async slot's thread, an async one
awaited on the slot's loop; watched for its timeout and cancel requests either way."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from ..errors import JobCancelledError, JobTimeoutError
from ..job import Job
from ..tasks import Handler, is_async_callable
from .aio import AsyncSlot
from .session import JobSession
from .watchdog import Abandoned, HandlerCancelled, HandlerTimeout, Slot, Watchdog


class _Cancelled(JobCancelledError):
    """The job's cancel request was delivered: whatever its handler did, it ends cancelled."""


def cancel_message(job: Job, ran: bool = True) -> str:
    asked = job._cancel_requested_at
    when = f" (asked at {asked:%Y-%m-%d %H:%M:%S} UTC)" if asked is not None else ""
    return f"cancelled on request{when} {'while running' if ran else 'before its handler started'}"


def timeout_message(job: Job, timeout: float) -> str:
    return (
        f"job {job.id} (task {job.task!r}) ran past its {float(timeout)!r} s timeout and was "
        "interrupted: make the handler faster, or give it more time with "
        "@app.task(..., timeout=SECONDS) (or --job-timeout / DBQUEUE_JOB_TIMEOUT for the worker)"
    )


#: An async handler's job reached a runner without an event loop (eager mode, a plain thread).
NO_LOOP_MESSAGE = (
    "the handler is an async def, which this runner (eager mode, or a call without an event "
    "loop) cannot await: run the job with a worker (`dbqueue worker`), which awaits async "
    "handlers on its event loop, or make the handler a plain def"
)


class Sessions:
    """The sessions a batch's handlers get, on the batch's connection: a JobSession for plain
    handlers, an AsyncJobSession for async ones (made on first use: most batches need one)."""

    __slots__ = ("conn", "savepoint", "aio", "_sync", "_async")

    def __init__(self, conn: Connection, savepoint: bool, aio: AsyncSlot | None) -> None:
        self.conn, self.savepoint, self.aio = conn, savepoint, aio
        self._sync: JobSession | None = None
        self._async: Any = None

    def for_handler(self, is_async: bool) -> Any:
        if is_async:
            if self._async is None:
                assert self.aio is not None
                self._async = self.aio.session(self.conn, self.savepoint)
            return self._async
        if self._sync is None:
            self._sync = JobSession(self.conn, savepoint=self.savepoint)
        return self._sync


class HandlerCalls:
    """The executor's handler calls (a mixin: the attributes below are the BatchExecutor's)."""

    aio: AsyncSlot | None
    watchdog: Watchdog | None
    slot: Slot | None
    _async_handlers: dict[Handler, bool]

    def _is_async(self, handler: Handler) -> bool:
        try:
            return self._async_handlers[handler]
        except KeyError:
            found = self._async_handlers[handler] = is_async_callable(handler)
            return found
        except TypeError:  # an unhashable callable
            return is_async_callable(handler)

    def _call_sync(self, handler: Handler, job: Job, session: Any) -> Any:
        """A plain handler: here (a worker thread), or on an async slot's thread."""
        if self.aio is None:
            return handler(job, session)
        return self.aio.run_sync(handler, job, session)

    def _call_async(self, handler: Handler, job: Job, session: Any) -> Any:
        assert self.aio is not None
        return self.aio.run_async(handler, job, session, self.slot)

    def _run_watched(
        self, call: Any, handler: Handler, job: Job, session: Any, timeout: float | None
    ) -> Any:
        """Run the handler with the watchdog armed; a timeout becomes JobTimeoutError, and a
        cancel request that reached the job (``job.cancel_requested()``) _Cancelled."""
        watchdog, slot = self.watchdog, self.slot
        assert watchdog is not None and slot is not None
        error: BaseException | None = None
        value = None
        if not watchdog.arm(slot, job, timeout):
            raise _Cancelled(cancel_message(job, ran=False))
        try:
            try:
                value = call(handler, job, session)
            except BaseException as exc:
                error = exc
            finally:
                fired = watchdog.disarm(slot)
        except (HandlerTimeout, HandlerCancelled):  # arrived after the handler returned, before
            fired = watchdog.disarm(slot)  # disarm cancelled it
        if slot.abandoned:
            raise Abandoned
        if job._cancel_requested_at is not None:
            cause = None if isinstance(error, HandlerCancelled) else error
            raise _Cancelled(
                f"{cancel_message(job)}: its database writes were rolled back"
            ) from cause
        if fired:
            assert timeout is not None
            cause = error if error is not None and not isinstance(error, HandlerTimeout) else None
            raise JobTimeoutError(timeout_message(job, timeout)) from (cause or error)
        if error is not None:
            raise error
        return value

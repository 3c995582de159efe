"""The one path from claimed jobs to their outcomes: resolve the handler, wrap it in the App's
middlewares, run it watched (timeouts, cancel requests), keep or discard its writes, and turn
what it returned or raised into an Outcome per job. A plain task's handler gets one job; a batch
task's handler gets its jobs as one list and may fail some of them by returning a mapping."""

from __future__ import annotations

import functools
import inspect
import logging
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from dbqueue.base.results import encode_result
from dbqueue.errors import (
    AttemptFailed,
    DbqueueError,
    Discard,
    JobCancelledError,
    JobTimeoutError,
    Retry,
)
from dbqueue.job import Job, MalformedPayload
from dbqueue.runtime.tenants import bind as bind_tenant
from dbqueue.tasks.failures import AttemptError, attempt_error
from dbqueue.tasks.registry import TenantHandler, is_async_callable
from dbqueue.tasks.retry import BACKOFF, Requested
from dbqueue.worker.aio import AsyncSlot
from dbqueue.worker.session import JobSession
from dbqueue.worker.watchdog import Abandoned, HandlerCancelled, HandlerTimeout, Slot, Watchdog

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext
    from dbqueue.runtime.tenants import TenantDatabases
    from dbqueue.tasks.hooks import WorkerHooks
    from dbqueue.tasks.registry import Handler, TaskDefinition, TaskRegistry

log = logging.getLogger("dbqueue.worker")


@dataclass(frozen=True)
class Outcome:
    """What running one job's handler produced. ``value``: what a success stores (None, the
    result's JSON, or a Message); ``message``: a failure's; ``requested``: the retry a failure
    asks for (the backoff rule; None: dead now, the handler raised Discard; seconds: Retry)."""

    ok: bool
    message: str | None = None
    value: str | None = None
    requested: Requested = BACKOFF
    #: The job was cancelled on request: recorded ``cancelled``, not as a failed attempt.
    cancelled: bool = False
    #: Not run after all (its batch stopped for another job's cancel request): given back, as
    #: if never claimed, with no attempt counted.
    given_back: bool = False
    #: A failure's entry in the job's list of errors (None: ``message`` alone, no traceback).
    error: AttemptError | None = None


#: A handler that returned None: the common case, one shared object.
SUCCEEDED = Outcome(True)
GIVEN_BACK = Outcome(False, given_back=True)


class _Cancelled(JobCancelledError):
    """The job's cancel request was delivered: whatever its handler did, it ends cancelled."""

    def __init__(self, message: str, ran: bool) -> None:
        super().__init__(message)
        self.ran = ran


def describe_failure(exc: BaseException) -> str:
    """What the job's message column records: the exception, then where it came from."""
    head = f"{type(exc).__name__}: {exc}".rstrip(": ")
    if exc.__traceback__ is None:  # never raised: named in a batch handler's mapping
        return head
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=20))
    return f"{head}\n{trace}"


def asked_for(exc: Discard | Retry) -> Outcome:
    """The failed attempt a handler's Discard (dead now) or Retry (again in exactly that many
    seconds) stands for; its message starts the way the handler raised it."""
    if isinstance(exc, Discard):
        return Outcome(
            False, f"Discard: {exc.reason or 'the handler discarded the job'}", None, None
        )
    reason = f": {exc.reason}" if exc.reason else ""
    return Outcome(False, f"Retry(in_seconds={exc.in_seconds:g}){reason}", None, exc.in_seconds)


def failure_of(exc: BaseException) -> Outcome:
    """The failed attempt an exception stands for (raised, or named in a batch's mapping)."""
    if isinstance(exc, AttemptFailed):  # an expected failure whose message says it all
        return Outcome(False, str(exc))
    if isinstance(exc, (Discard, Retry)):  # the handler says when the job runs again, if ever
        return asked_for(exc)
    return Outcome(False, describe_failure(exc), error=attempt_error(exc))


def cancel_message(job: Job, ran: bool = True) -> str:
    asked = job.cancel_requested_at
    when = f" (asked at {asked:%Y-%m-%d %H:%M:%S} UTC)" if asked is not None else ""
    return f"cancelled on request{when} {'while running' if ran else 'before its handler started'}"


def timeout_message(job: Job, timeout: float, size: int = 1) -> str:
    what = f"job {job.id}" if size == 1 else f"the batch of {size} jobs (job {job.id} first)"
    return (
        f"{what} (task {job.task!r}) ran past its {float(timeout)!r} s timeout and was "
        "interrupted: make the handler faster, or give it more time with "
        "@app.task(..., timeout=SECONDS) (or --job-timeout / DBQUEUE_JOB_TIMEOUT for the worker)"
    )


def _malformed(job: Job) -> Outcome:
    assert isinstance(job.payload, MalformedPayload)
    return Outcome(
        False,
        f"{job.payload.error}; the row was probably written by hand: fix its payload column "
        "and requeue it",
    )


def partial_failures(value: Any, jobs: list[Job]) -> dict[int, Outcome]:
    """A batch handler's return value: None (all succeeded) or job id (or Job) → exception."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(
            f"the batch handler returned {type(value).__name__} {value!r:.100}: return None "
            "(every job succeeded) or a mapping of job id → exception (those jobs failed)"
        )
    ids = {job.id for job in jobs}
    failed: dict[int, Outcome] = {}
    for key, exc in value.items():
        job_id = key.id if isinstance(key, Job) else key
        if job_id not in ids or not isinstance(exc, BaseException):
            raise TypeError(
                f"the batch handler's mapping has {key!r}: {exc!r:.100}; its keys must be ids "
                "(or Jobs) of its batch and its values exceptions"
            )
        failed[job_id] = failure_of(exc)
    return failed


class HandlerCalls:
    """Runs handlers for a ``BatchExecutor``: one job's, or a batch task's jobs at once."""

    def __init__(
        self,
        context: RuntimeContext,
        *,
        watchdog: Watchdog | None,
        slot: Slot | None,
        default_timeout: float | None,
        aio: AsyncSlot | None,
    ) -> None:
        self.registry: TaskRegistry = context.registry
        self.hooks: WorkerHooks = context.registry.hooks
        #: Runs deliveries no code is registered for: webhook calls.
        self.webhooks: Handler = context.webhooks
        #: Results share the payloads' size limit.
        self.max_result_bytes = context.max_payload_bytes
        #: Set in a Worker: the handler runs watched, for timeouts and cancel requests (in
        #: memory only).
        self.watchdog = watchdog
        self.slot = slot
        self.default_timeout = default_timeout
        #: Where handlers registered with tenant_database=True find the job's tenant database.
        self.tenants: TenantDatabases | None = context.tenants
        #: Set in an async slot: async handlers are awaited on its loop, plain ones run on its
        #: thread. None: a worker thread, where only plain handlers can run.
        self.aio = aio
        self._async_handlers: dict[Handler, bool] = {}

    def run_one(self, sessions: Sessions, job: Job) -> Outcome:
        try:
            definition, handler = self.registry.resolve(job, self.webhooks)
        except DbqueueError as exc:
            return Outcome(False, str(exc))
        if isinstance(job.payload, MalformedPayload):
            return _malformed(job)
        is_async = self._is_async(handler)
        if is_async and self.aio is None:
            return Outcome(False, NO_LOOP_MESSAGE)
        session = sessions.for_handler(is_async)
        if isinstance(handler, TenantHandler):
            handler = bind_tenant(self.tenants, handler, session)
        try:
            value = self._call(definition, handler, job, [job], session)
            stored = None if value is None else encode_result(value, self.max_result_bytes)
            session.keep()
        # BaseException: SystemExit, KeyboardInterrupt or GeneratorExit raised by a handler in
        # this thread would otherwise end the thread silently, leaving the worker short of one.
        except BaseException as exc:
            return self._failed(session, exc, job)
        return SUCCEEDED if stored is None else Outcome(True, value=stored)

    def run_group(self, sessions: Sessions, jobs: list[Job]) -> tuple[list[Outcome], bool]:
        """Run a batch task's handler once on ``jobs``: their outcomes, in order, and whether
        the handler's writes were undone (it raised, or was interrupted)."""
        definition = self.registry.definition_for(jobs[0])
        outcomes = {job.id: _malformed(job) for job in jobs if _is_malformed(job)}
        ready = [job for job in jobs if job.id not in outcomes]
        undone = False
        is_async = definition.handler is not None and self._is_async(definition.handler)
        if is_async and self.aio is None:
            return [Outcome(False, NO_LOOP_MESSAGE) for _ in jobs], False
        session = sessions.for_handler(is_async)
        if ready:
            assert definition.handler is not None
            try:
                value = self._call(definition, definition.handler, ready, ready, session)
                failed = partial_failures(value, ready)
                session.keep()
            except _Cancelled as exc:
                undone = True
                session.discard()
                outcomes.update(_cancelled_batch(ready, exc))
            except BaseException as exc:
                undone = True
                failure = self._failed(session, exc, ready[0])
                outcomes.update({job.id: failure for job in ready})
            else:
                outcomes.update({job.id: failed.get(job.id, SUCCEEDED) for job in ready})
        return [outcomes[job.id] for job in jobs], undone

    def _call(
        self,
        definition: TaskDefinition | None,
        handler: Handler,
        subject: Any,
        group: list[Job],
        session: Any,
    ) -> Any:
        """``handler(subject, session)`` inside the middlewares, watched if the worker has a
        watchdog; ``group``: the jobs of the call."""
        if self.hooks.middlewares or self.aio is not None:
            call = self.hooks.wrap(subject, lambda: self._invoke(handler, subject, session))
        else:  # a worker thread without middlewares: the handler itself, no Python frame
            call = functools.partial(handler, subject, session)
        if self.watchdog is None:
            value = call()
        else:
            timeout = (definition.timeout if definition else None) or self.default_timeout
            value = self._run_watched(call, group, timeout)
        if value is not None and inspect.isawaitable(value):
            _close(value)
            raise TypeError(
                f"the handler returned {type(value).__name__} {value!r} instead of running: "
                "it is async (or returns an awaitable), which a worker thread cannot await; "
                "make it a plain def"
            )
        return value

    def _is_async(self, handler: Handler) -> bool:
        try:
            return self._async_handlers[handler]
        except KeyError:
            found = self._async_handlers[handler] = is_async_callable(handler)
            return found
        except TypeError:  # an unhashable callable
            return is_async_callable(handler)

    def _invoke(self, handler: Handler, subject: Any, session: Any) -> Any:
        """The handler's own call: here (a worker thread), or in an async slot — awaited on
        its loop (an async def), or on the slot's thread (a plain def)."""
        aio = self.aio
        if aio is None:
            return handler(subject, session)
        if self._is_async(handler):
            return aio.run_async(handler, subject, session, self.slot)
        return aio.run_sync(handler, subject, session)

    def _failed(self, session: Any, exc: BaseException, job: Job) -> Outcome:
        """The outcome of a handler call that raised; its writes are discarded."""
        if isinstance(exc, Abandoned):
            raise exc
        if isinstance(exc, _Cancelled):  # whatever the handler did, its writes go
            session.discard()
            return Outcome(False, str(exc), cancelled=True)
        if not isinstance(exc, (AttemptFailed, Discard, Retry)):
            if session.bind.invalidated:  # type: ignore[union-attr]
                # The database connection broke under the handler (server restart, network):
                # the batch transaction is gone with it, so nothing can be recorded, and the
                # job is not at fault. The worker loop reconnects; the jobs are claimed again.
                raise exc
            log.debug("job %s (%s) raised", job.id, job.task, exc_info=exc)
        session.discard()
        return failure_of(exc)

    def _run_watched(self, call: Callable[[], Any], group: list[Job], timeout: float | None) -> Any:
        """Run the call with the watchdog armed; a timeout becomes JobTimeoutError, and a
        cancel request that reached a job of it (``job.cancel_requested()``) _Cancelled."""
        watchdog, slot = self.watchdog, self.slot
        assert watchdog is not None and slot is not None
        error: BaseException | None = None
        value = None
        job = group[0]
        if not watchdog.arm(slot, job, timeout, group):
            first = next(j for j in group if j.cancel_requested_at is not None)
            raise _Cancelled(cancel_message(first, ran=False), ran=False)
        try:
            try:
                value = call()
            except BaseException as exc:
                error = exc
            finally:
                fired = watchdog.disarm(slot)
        except (HandlerTimeout, HandlerCancelled):  # arrived after the handler returned, before
            fired = watchdog.disarm(slot)  # disarm cancelled it
        if slot.abandoned:
            raise Abandoned
        asked = _first_asked(group)
        if asked is not None:
            cause = None if isinstance(error, HandlerCancelled) else error
            message = f"{cancel_message(asked)}: its database writes were rolled back"
            raise _Cancelled(message, ran=True) from cause
        if fired:
            assert timeout is not None
            cause = error if error is not None and not isinstance(error, HandlerTimeout) else None
            raise JobTimeoutError(timeout_message(job, timeout, len(group))) from (cause or error)
        if error is not None:
            raise error
        return value


def _first_asked(group: list[Job]) -> Job | None:
    """The first job of a handler call that a cancel request reached, if any."""
    if len(group) == 1:  # a plain task's call: no generator per job
        job = group[0]
        return job if job.cancel_requested_at is not None else None
    return next((j for j in group if j.cancel_requested_at is not None), None)


def _is_malformed(job: Job) -> bool:
    return isinstance(job.payload, MalformedPayload)


def _cancelled_batch(jobs: list[Job], exc: _Cancelled) -> dict[int, Outcome]:
    """A cancel request reached jobs of a batch: those end cancelled, the others of the batch
    are given back to run again (the batch's writes are rolled back)."""
    outcomes: dict[int, Outcome] = {}
    for job in jobs:
        if job.cancel_requested_at is None:
            outcomes[job.id] = GIVEN_BACK
            continue
        message = cancel_message(job, exc.ran)
        if exc.ran:
            message += ": the batch's database writes were rolled back"
        outcomes[job.id] = Outcome(False, message, cancelled=True)
    return outcomes


#: An async handler's job reached a runner without an event loop (eager mode, a plain thread).
NO_LOOP_MESSAGE = (
    "the handler is an async def, which this runner (eager mode, or a call without an event "
    "loop) cannot await: run the job with a worker (`dbqueue worker`), which awaits async "
    "handlers on its event loop, or make the handler a plain def"
)


class Sessions:
    """The sessions a batch's handlers get, on the batch's connection: a JobSession for plain
    handlers, an AsyncJobSession for async ones (each made on first use)."""

    __slots__ = ("conn", "savepoint", "aio", "own_transaction", "_sync", "_async")

    def __init__(
        self,
        conn: Connection,
        savepoint: bool,
        aio: AsyncSlot | None,
        own_transaction: bool = False,
    ) -> None:
        self.conn, self.savepoint, self.aio = conn, savepoint, aio
        #: The job runs outside its claim's transaction: the sessions' transactions are theirs.
        self.own_transaction = own_transaction
        self._sync: JobSession | None = None
        self._async: Any = None

    def reset(self) -> bool:
        """Ready these sessions for another batch on the same connection; False if they cannot
        serve one (an async session was made, or a session is still in use or holds a tenant
        session: its batch ended abruptly), and new ones must be made."""
        sync = self._sync
        if self._async is not None:
            return False
        if sync is not None:
            if not sync.reusable():
                return False
            sync.tenant_used = False
        return True

    @property
    def tenant_used(self) -> bool:
        """A job of this batch used a tenant database (plain handlers only): the batch ends."""
        return self._sync is not None and self._sync.tenant_used

    def for_handler(self, is_async: bool) -> Any:
        if is_async:
            if self._async is None:
                assert self.aio is not None
                self._async = self.aio.session(self.conn, self.savepoint, self.own_transaction)
            return self._async
        if self._sync is None:
            self._sync = JobSession(self.conn, self.savepoint, self.own_transaction)
        return self._sync


def _close(awaitable: Any) -> None:
    """Close a coroutine that will never run, so Python does not warn it was never awaited."""
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()

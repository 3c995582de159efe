"""``app.result`` and ``app.call``: a job's stored result, and a synchronous call that enqueues
a job in a transaction of its own and waits for its result; ``aresult``, ``acall`` and
``acancel``, the same for asyncio code.

A waiting caller reads the job's row by primary key, and between reads waits for a push that
the job finished: PostgreSQL's NOTIFY (one LISTEN connection per App, shared by every caller
of the process, opened on first use and closed once no caller has waited for a while), else the
lock server's push where the App knows one, else it polls (5 ms, growing to 200 ms). Only jobs
``call`` enqueued are announced (their ``awaited`` flag): a worker pays nothing for the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Generator, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection
from typing_extensions import Unpack

from dbqueue import dialects
from dbqueue.app.aio import AsyncTarget, async_connection_for
from dbqueue.app.targets import target_or_engine
from dbqueue.base import results
from dbqueue.engine import NewJob
from dbqueue.errors import (
    CallFromHandlerError,
    ConfigurationError,
    JobCancelledError,
    JobFailedError,
    JobNotFinishedError,
    JobNotFoundError,
)
from dbqueue.job import Status
from dbqueue.runtime.cancellation import CancelCall, Cancellation, job_ids
from dbqueue.runtime.enqueue import EnqueueOptions, check_option_names, job_for_task
from dbqueue.runtime.targets import Target, connection_for
from dbqueue.tasks.suggestions import refuse_unregistered

if TYPE_CHECKING:
    from dbqueue.app.eager import AfterCommit
    from dbqueue.base.wakeup import Notifier
    from dbqueue.lockserver.client import LockServerClient
    from dbqueue.runtime.commit_wake import CommitWaker
    from dbqueue.runtime.context import RuntimeContext

#: Polling where nothing pushes: the first read after this, each wait this much longer, up to
#: MAX_POLL (a job's end is seen within MAX_POLL of its commit, at one indexed read per wait).
FIRST_POLL = 0.005
POLL_GROWTH = 1.5
MAX_POLL = 0.2
#: Where the job's end is pushed, reads only cover a lost push (a listener reconnecting).
PUSHED_POLL = 1.0
#: How long the first caller waits for the LISTEN connection before it enqueues (else it polls).
LISTEN_READY = 5.0
#: The LISTEN connection is closed once no caller has waited for this long.
LISTENER_IDLE = 10.0

_NOT_FINISHED: Any = object()


class _Watch:
    """One caller's wait: set when the job may have finished (look again). A thread waits on
    ``event``; a coroutine on ``wait_async``, bound to its loop on first use."""

    __slots__ = ("event", "pushed", "_loop", "_async_event")

    def __init__(self, pushed: bool) -> None:
        self.event = threading.Event()
        self.pushed = pushed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async_event: asyncio.Event | None = None

    def set(self) -> None:
        """From any thread."""
        self.event.set()
        loop, event = self._loop, self._async_event
        if loop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(event.set)

    def clear(self) -> None:
        self.event.clear()
        if self._async_event is not None:
            self._async_event.clear()

    async def wait_async(self, seconds: float | None) -> None:
        """Until set or ``seconds`` have passed (None: no limit), without blocking the loop."""
        if self._async_event is None:
            self._async_event = asyncio.Event()
            self._loop = asyncio.get_running_loop()
        if self.event.is_set():  # set before the loop was bound
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._async_event.wait(), seconds)


class FinishWaiters:
    """This App's callers waiting for jobs, and the push channel they share."""

    def __init__(self, context: RuntimeContext, waker: CommitWaker) -> None:
        self.context = context
        self._waker = waker
        self._lock = threading.Lock()
        self._watches: dict[int, list[_Watch]] = {}
        self._listener: Notifier | None = None
        self._last_watch = 0.0
        self._idle_timer: threading.Timer | None = None

    @contextlib.contextmanager
    def watch(self, job_id: int) -> Iterator[_Watch]:
        """Be woken when ``job_id`` may have finished, from now until the block ends (enter it
        before the enqueue commits, so that no announcement can come too early)."""
        hints = self._waker.lock_server_client()
        dialect = self._push_database()
        # The lock server's push names the job; a watch of every commit (SQLite) only says "look
        # again", and its ticks would set the pace of a call: the short polls go on beside it.
        wanted = dialect is not None and (hints is None or dialect.supports_listen_notify)
        listener = self._ensure_listener() if wanted else None
        exact = listener is not None and listener.pushes
        watch = _Watch(pushed=exact or hints is not None)
        with self._lock:
            self._watches.setdefault(job_id, []).append(watch)
        subscription = None
        if listener is None and hints is not None:
            subscription = self._subscribe(hints, job_id, watch)
        try:
            yield watch
        finally:
            if subscription is not None:
                assert hints is not None
                hints.unsubscribe(subscription)
            with self._lock:
                found = self._watches.get(job_id, [])
                if watch in found:
                    found.remove(watch)
                if not found:
                    self._watches.pop(job_id, None)
                self._last_watch = time.monotonic()
                if self._listener is not None and self._idle_timer is None:
                    self._close_later(LISTENER_IDLE)

    def _push_database(self) -> dialects.Dialect | None:
        """The database's dialect when it tells callers of finished jobs (PostgreSQL's NOTIFY,
        SQLite's commit watch), else None."""
        engine = self.context.engine
        dialect = dialects.for_sqlalchemy(engine.dialect)
        return dialect if dialect.finishes_pushed else None

    def _subscribe(self, client: LockServerClient, job_id: int, watch: _Watch) -> int:
        if not client.connected:
            client.wait_connected(min(LISTEN_READY, client.timeout))
        name = results.finished_name(self.context.names.qualified_jobs, job_id)
        return client.subscribe([name], lambda _name: watch.set())

    def _ensure_listener(self) -> Notifier:
        with self._lock:
            listener = self._listener
            if listener is None:
                dialect = self._push_database()
                assert dialect is not None
                listener = dialect.finish_listener(
                    self.context.engine, self.context.names.qualified_jobs, self._finished
                )
                assert listener is not None
                listener.start(lambda: None)
                self._listener = listener
        listening = getattr(listener, "listening", None)
        if listening is not None:
            listening.wait(LISTEN_READY)  # else: polling covers what it would miss
        return listener

    def _finished(self, job_ids: list[int] | None) -> None:
        """From the listener: these jobs finished (None: any may have, look again)."""
        with self._lock:
            if job_ids is None:
                watches = [w for found in self._watches.values() for w in found]
            else:
                watches = [w for i in job_ids for w in self._watches.get(i, ())]
        for watch in watches:
            watch.set()

    def _close_later(self, seconds: float) -> None:
        """(With the lock held.) One timer at a time closes an idle listener."""
        self._idle_timer = threading.Timer(seconds, self._close_if_idle)
        self._idle_timer.daemon = True
        self._idle_timer.start()

    def _close_if_idle(self) -> None:
        with self._lock:
            self._idle_timer = None
            if self._listener is None:
                return
            idle = time.monotonic() - self._last_watch
            if self._watches or idle < LISTENER_IDLE:
                self._close_later(LISTENER_IDLE - idle if not self._watches else LISTENER_IDLE)
                return
            listener, self._listener = self._listener, None
        listener.stop()


class ResultCalls:
    """``result`` and ``call``, and for asyncio code ``aresult``, ``acall`` and ``acancel``.
    ``waiters`` tells them when a job may have finished; ``after_commit`` follows
    a call's job as any enqueue's (in eager mode it runs at once).

    A wait's logic is written once (``_wait_steps``); the sync calls run its reads and waits in
    the caller's thread, the async ones await them on the App's asyncio engine (on a thread
    where the database has no asyncio driver), so the event loop runs on meanwhile."""

    def __init__(
        self, context: RuntimeContext, waiters: FinishWaiters, after_commit: AfterCommit
    ) -> None:
        self.context = context
        self._waiters = waiters
        self._after_commit = after_commit

    def result(
        self, job_id: int, timeout: float | None = None, target: Target | None = None
    ) -> Any:
        """The result a job's handler returned (decoded JSON; None if it returned nothing).

        ``timeout``: seconds to wait for the job to finish; None (the default) does not wait.
        Raises JobFailedError (``.last_error``: the last attempt's message) for a dead job,
        JobCancelledError for a cancelled one, JobNotFinishedError — a TimeoutError — when it
        has not finished in time (None: when it is not finished now), JobNotFoundError when
        there is no such job. ``target`` (a Session, Connection or Engine) is read through:
        waiting through a transaction needs it to see other transactions' commits.
        """
        timeout = _check_timeout(timeout)
        deadline = time.monotonic() + (timeout or 0.0)
        waiting = self._waiters.watch(job_id) if timeout else _not_waiting()
        where = target_or_engine(self.context, target)
        with waiting as watch:
            return self._wait(_wait_steps(timeout, deadline, watch), job_id, watch, where)

    async def aresult(
        self, job_id: int, timeout: float | None = None, target: AsyncTarget = None
    ) -> Any:
        """``result`` for asyncio: the same answers and errors, awaited; ``target`` an
        AsyncSession or AsyncConnection to read through (None: the App's asyncio engine)."""
        timeout = _check_timeout(timeout)
        deadline = time.monotonic() + (timeout or 0.0)
        async with self._awatch(job_id, bool(timeout)) as watch:
            steps = _wait_steps(timeout, deadline, watch)
            return await self._await(steps, job_id, watch, target)

    def call(
        self,
        task: str,
        payload: Any = None,
        timeout: float | None = 30.0,
        **options: Unpack[EnqueueOptions],
    ) -> Any:
        """Enqueue ``task`` in a transaction of its own, wait for a worker to run it, and return
        its handler's result. ``timeout``: seconds to wait (None: no limit); the options are
        ``enqueue``'s. Raises what ``result`` raises: JobFailedError when the job is dead (its
        attempts ran out, or it was discarded), JobNotFinishedError (a TimeoutError) when it
        did not finish in time — the job stays queued, and ``error.job_id`` names it.
        UnknownTaskError at once, enqueueing nothing, when the App registers tasks but not
        ``task``. Refused inside a handler (CallFromHandlerError): it would wait on itself."""
        timeout, deadline, job = self._call_job("call", task, payload, timeout, options)
        engine = self.context.engine
        with contextlib.ExitStack() as stack:
            with connection_for(engine) as conn:
                job_id = self.context.queue_engine(conn).inserts.insert(conn, job)
                watch = stack.enter_context(self._waiters.watch(job_id))
            # Wakes the workers, or runs the job here in eager mode.
            self._after_commit.enqueued(None, [job.queue], [job_id])
            return self._wait(_wait_steps(timeout, deadline, watch), job_id, watch, engine)
        raise AssertionError("unreachable")  # pragma: no cover - for type checkers

    async def acall(
        self, task: str, payload: Any, timeout: float | None, options: Mapping[str, Any]
    ) -> Any:
        """``call`` for asyncio: the job is enqueued through the App's asyncio engine, and its
        result awaited; the event loop runs other tasks meanwhile."""
        timeout, deadline, job = self._call_job("acall", task, payload, timeout, options)
        if not self.context.has_async_driver:  # SingleStore: the sync call, on a thread
            return await asyncio.to_thread(self.call, task, payload, timeout, **options)
        async with contextlib.AsyncExitStack() as stack:
            async with async_connection_for(self.context, "acall", None, False) as (conn, _):
                job_id = await conn.run_sync(self._insert, job)
                watch = await stack.enter_async_context(self._awatch(job_id, True))
            if self._after_commit.eager:  # the job runs here, at once: not on the loop
                await asyncio.to_thread(self._after_commit.enqueued, None, [job.queue], [job_id])
            else:
                self._after_commit.enqueued(None, [job.queue], [job_id])
            return await self._await(_wait_steps(timeout, deadline, watch), job_id, watch, None)
        raise AssertionError("unreachable")  # pragma: no cover - for type checkers

    async def acancel(self, ids: int | Iterable[int], target: AsyncTarget = None) -> dict[int, str]:
        """``cancel`` for asyncio: the same steps (``CancelCall``), its transaction on
        ``target`` (an AsyncSession or AsyncConnection) or the App's asyncio engine."""
        call = CancelCall(self.context, job_ids(ids))
        if not call.ids:
            return {}
        if target is None and not self.context.has_async_driver:
            return await asyncio.to_thread(Cancellation(self.context).cancel, call.ids)
        if call.store.separate:  # a side database, written with the sync engine: on a thread
            await asyncio.to_thread(call.post_early, self.context.engine)
        try:
            async with async_connection_for(self.context, "acancel", target, True) as (conn, _):
                report: dict[int, str] = await conn.run_sync(call.run)
        except BaseException:
            await asyncio.to_thread(call.withdraw)
            raise
        await asyncio.to_thread(call.settle)
        return report

    def _call_job(
        self, call: str, task: str, payload: Any, timeout: Any, options: Mapping[str, Any]
    ) -> tuple[float | None, float | None, NewJob]:
        """A call's checked timeout, its deadline and its job (refused inside a handler)."""
        if results.in_handler_thread():
            raise CallFromHandlerError(
                f"app.{call}({task!r}) inside a handler: the handler would hold its worker "
                "thread and its transaction while waiting for a job that may need them. Enqueue "
                "the job with app.enqueue(session, …) and let the handler return (or chain the "
                "work in the job's own handler)"
            )
        timeout = _check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        check_option_names(call, options)
        refuse_unregistered(self.context.registry, f"app.{call}", task)
        job = job_for_task(self.context, task, payload, options)
        job.awaited = True
        return timeout, deadline, job

    def _insert(self, conn: Connection, job: NewJob) -> int:
        return self.context.queue_engine(conn).inserts.insert(conn, job)  # type: ignore[no-any-return]

    @contextlib.asynccontextmanager
    async def _awatch(self, job_id: int, waits: bool) -> AsyncIterator[_Watch]:
        """``FinishWaiters.watch`` for a coroutine: its first use may wait for the LISTEN
        connection or the lock server, so it is entered on a thread."""
        if not waits:
            yield _Watch(pushed=False)
            return
        watching = self._waiters.watch(job_id)
        watch = await asyncio.to_thread(watching.__enter__)
        try:
            yield watch
        finally:
            watching.__exit__(None, None, None)

    def _wait(self, steps: _Steps, job_id: int, watch: _Watch, target: Target) -> Any:
        """Run a wait's steps in this thread."""
        try:
            step = next(steps)
            while True:
                if step is _READ:
                    step = steps.send(self._read(job_id, target))
                else:
                    watch.event.wait(step)
                    step = next(steps)
        except StopIteration as done:
            return done.value

    async def _await(self, steps: _Steps, job_id: int, watch: _Watch, target: AsyncTarget) -> Any:
        """Run a wait's steps on the event loop."""
        try:
            step = next(steps)
            while True:
                if step is _READ:
                    step = steps.send(await self._aread(job_id, target))
                else:
                    await watch.wait_async(step)
                    step = next(steps)
        except StopIteration as done:
            return done.value

    def _read(self, job_id: int, target: Target) -> dict[str, Any]:
        with connection_for(target) as conn:
            return self._read_on(conn, job_id)

    async def _aread(self, job_id: int, target: AsyncTarget) -> dict[str, Any]:
        if target is None and not self.context.has_async_driver:
            return await asyncio.to_thread(self._read, job_id, self.context.engine)
        async with async_connection_for(self.context, "aresult", target, False) as (conn, _):
            return await conn.run_sync(self._read_on, job_id)  # type: ignore[no-any-return]

    def _read_on(self, conn: Connection, job_id: int) -> dict[str, Any]:
        state = self.context.queue_engine(conn).queries.finish_state(conn, job_id)
        if state is None:
            raise JobNotFoundError(
                f"there is no job {job_id} in {self.context.names.qualified_jobs}: it was never "
                "enqueued there, or purged after its retention period (QUEUE_PURGE_MAX_AGE)"
            )
        return state  # type: ignore[no-any-return]


#: A step of a wait asking for the job's row (sent back as its state).
_READ: Any = object()
#: A wait's steps: _READ, or seconds to wait for a wake-up (None: no limit); returns the result.
_Steps = Generator[Any, Any, Any]


def _wait_steps(timeout: float | None, deadline: float | None, watch: _Watch) -> _Steps:
    """Read the job until it has finished or the deadline passes (None: no deadline), without
    doing the reads or the waits: the sync and the async calls do those.
    A wake-up reads at once but leaves the polls where they were: a commit watch (SQLite)
    wakes on commits that are not the job's end, which must not push its next read back."""
    delay, next_poll = FIRST_POLL, 0.0
    while True:
        watch.clear()  # an announcement from here on makes the wait below return
        state = yield _READ
        value = _outcome(state)
        if value is not _NOT_FINISHED:
            return value
        now = time.monotonic()
        remaining = None if deadline is None else deadline - now
        if remaining is not None and remaining <= 0:
            raise _not_finished(state, timeout)
        if now >= next_poll:
            next_poll, delay = now + delay, min(MAX_POLL, delay * POLL_GROWTH)
        pushed = watch.pushed and bool(state["awaited"])
        wait = PUSHED_POLL if pushed else next_poll - now
        yield wait if remaining is None else min(wait, remaining)


@contextlib.contextmanager
def _not_waiting() -> Iterator[_Watch]:
    yield _Watch(pushed=False)


def _check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ConfigurationError(f"timeout={timeout!r} must be a number of seconds, 0 or more")
    return float(timeout)


def _outcome(state: dict[str, Any]) -> Any:
    """The result of a finished job, an error for one that can have none, or _NOT_FINISHED."""
    status = state["status"]
    if status == Status.SUCCEEDED:
        return state["result"]
    job = f"job {state['id']} (task {state['task']!r})"
    if status == Status.CANCELLED:
        raise JobCancelledError(f"{job} was cancelled: it has no result", state["id"])
    if status == Status.DEAD:
        last = state["message"] or ""
        first = last.splitlines()[0] if last else "no message"
        raise JobFailedError(
            f"{job} is dead after attempt {state['attempt']} of {state['max_attempts']}: "
            f"{first} (`dbqueue job show {state['id']}` has the whole message; `dbqueue dead "
            f"requeue {state['id']}` runs it again)",
            state["id"],
            last or None,
        )
    return _NOT_FINISHED


def _not_finished(state: dict[str, Any], timeout: float | None) -> JobNotFinishedError:
    job_id = state["id"]
    where = (
        f"job {job_id} (task {state['task']!r}, queue {state['queue']!r}) is {state['status']}, "
        f"{state['attempt']} of {state['max_attempts']} attempts started"
    )
    if not timeout:
        return JobNotFinishedError(
            f"{where}: not finished, so it has no result yet; pass timeout=SECONDS to wait for it",
            job_id,
        )
    return JobNotFinishedError(
        f"{where}: it did not finish within {timeout:g} s. It stays queued: "
        f"app.result({job_id}, timeout=…) waits for it again (is a worker consuming queue "
        f"{state['queue']!r}?)",
        job_id,
    )

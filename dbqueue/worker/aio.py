"""Async handlers: the worker's slots on an event loop, running the same claim loop and executor.

Why greenlets and not a second, async copy of the engine: dbqueue's job logic (claims, outcomes,
fences, retries, dead letters, the claim loop's batching and idle waits) is written once as
ordinary functions over a SQLAlchemy ``Connection``. SQLAlchemy's own asyncio extension runs its
whole ORM the same way: an async driver (asyncpg, aiomysql, aiosqlite) sits under a sync
``Connection`` whose every I/O suspends a greenlet and is awaited on the event loop. An async
slot is one asyncio task running the claim loop inside such a greenlet (``greenlet_spawn``): every
statement is the same object, compiled once, and the only code that knows it is on a loop is
here — where the loop waits, and how a handler is called:

- an ``async def`` handler is awaited as a task of its own (a timeout or a cancel request cancels
  that task), with an ``AsyncSession`` over the slot's connection, joined to the transaction
  that holds the claim (a savepoint per job, as for plain handlers);
- a plain ``def`` handler runs on the slot's own thread, so it never blocks the loop; the
  statements of its ``Session`` are sent back to the loop, to the slot's connection, and the
  slot waits for the handler (one job at a time per slot either way).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from dbqueue.base.results import running_handlers
from dbqueue.lockserver.locks import ASYNC_OWNER
from dbqueue.worker.watchdog import CANCEL, HandlerCancelled, HandlerTimeout, Slot

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncEngine

    from dbqueue.worker.async_session import AsyncJobSession
    from dbqueue.worker.session import JobSession


def await_(awaitable: Any) -> Any:
    """Suspend the calling greenlet until ``awaitable`` is done on the loop (SQLAlchemy's)."""
    from sqlalchemy import util

    wait = getattr(util, "await_", None) or util.await_only
    return wait(awaitable)


async def greenlet_spawn(fn: Callable[..., Any], *args: Any) -> Any:
    from sqlalchemy.util import greenlet_spawn as spawn

    return await spawn(fn, *args)


class Waits:
    """How a slot waits between claims: a worker thread blocks; an async slot awaits, so that
    the loop runs the other slots meanwhile."""

    def __init__(self, stopping: Callable[[], bool], stop_event: threading.Event) -> None:
        self.stopping = stopping
        self.stop_event = stop_event

    def signal(self, signal: Any, seen: int, timeout: float, replans: int | None = None) -> bool:
        return bool(signal.wait(seen, timeout, replans))

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def backoff(self, signal: Any, seconds: float) -> None:
        """Sleep ``seconds`` unless the worker stops."""
        self.stop_event.wait(seconds)


class LoopWaits(Waits):
    def signal(self, signal: Any, seen: int, timeout: float, replans: int | None = None) -> bool:
        return bool(await_(signal.wait_async(seen, timeout, replans)))

    def sleep(self, seconds: float) -> None:
        await_(asyncio.sleep(seconds))

    def backoff(self, signal: Any, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping() and (left := deadline - time.monotonic()) > 0:
            self.signal(signal, signal.generation, left)


class AsyncSlot:
    """What one async slot needs to run handlers: the loop, the async engine (for the
    handlers' AsyncSession), and the slot's own thread for plain handlers."""

    def __init__(self, loop: asyncio.AbstractEventLoop, engine: AsyncEngine, index: int) -> None:
        self.loop = loop
        self.engine = engine
        self.thread = HandlerThread(f"dbqueue-slot-{index}")
        #: The slot thread's id: where the watchdog raises in a plain handler.
        self.thread_id: int = self.thread.submit(_enter_handler_thread).result()
        #: The slot's own task (it runs the claim loop's greenlet, and awaits async handlers).
        self._task: asyncio.Task[Any] | None = None
        #: A token per async handler run: set while one runs; the one the watchdog cancelled.
        self._running: object | None = None
        self._cancelled: object | None = None

    def enter(self) -> None:
        """In the slot's greenlet, first: its locks on the lock server are owned by the slot
        (every slot shares the loop's thread) and requested without blocking the loop."""
        ASYNC_OWNER.set(self.thread_id)
        self._task = asyncio.current_task(self.loop)

    def watch(self, slot: Slot) -> None:
        """Let the watchdog reach this slot's handlers: plain ones on the slot's thread, async
        ones by cancelling their task."""
        slot.thread_id = self.thread_id
        slot.interrupt = self.interrupt

    def interrupt(self, exc_type: type[BaseException]) -> bool:
        """The watchdog's deadline fired (its thread): cancel the async handler, if one runs.
        False: none does (a plain handler: raise in the slot's thread instead)."""
        run = self._running
        if run is None:
            return False
        self.loop.call_soon_threadsafe(self._cancel, run)
        return True

    def _cancel(self, run: object) -> None:
        """On the loop: cancel the slot's task if that same handler run is still going — it is
        then suspended inside the handler, where the CancelledError lands."""
        if self._running is run and self._task is not None:
            self._cancelled = run
            self._task.cancel()

    def session(
        self, conn: Connection, savepoint: bool, own_transaction: bool = False
    ) -> AsyncJobSession:
        from sqlalchemy.ext.asyncio import AsyncConnection

        from dbqueue.worker.async_session import AsyncJobSession

        return AsyncJobSession(AsyncConnection(self.engine, conn), savepoint, own_transaction)

    def run_async(self, handler: Any, job: Any, session: Any, slot: Slot | None) -> Any:
        """Await ``handler(job, session)`` from the slot's greenlet: in the slot's own task, so
        a handler that never suspends costs no task and no turn of the loop. A timeout or a
        cancel request cancels the slot's task while it is suspended in the handler; that
        cancellation is taken back (``uncancel``) once it has become the handler's error."""
        run = self._running = object()
        try:
            return await_(handler(job, session))
        except asyncio.CancelledError:
            if self._cancelled is not run:
                raise  # the worker's own task is being cancelled: not the handler's doing
            self._cancelled = None
            uncancel = getattr(self._task, "uncancel", None)  # Python 3.11+
            if uncancel is not None:
                uncancel()
            cause = HandlerCancelled if slot is not None and slot.reason == CANCEL else None
            raise (cause or HandlerTimeout) from None
        finally:
            self._running = None

    def run_sync(self, handler: Any, job: Any, session: JobSession) -> Any:
        """Run a plain handler on the slot's thread; its statements come back to the loop."""
        return await_(
            asyncio.wrap_future(self.thread.submit(_bridged, self.loop, handler, job, session))
        )

    def close(self) -> None:
        self.thread.shutdown()


class HandlerThread:
    """A slot's own thread for plain handlers: ``submit(fn, *args)`` runs calls in turn and
    returns a future. A daemon, unlike a ThreadPoolExecutor's thread (which the interpreter
    joins at exit): a handler abandoned there, blocked, does not keep the process alive after
    the worker stopped."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._calls.put((future, fn, args))
        return future

    def shutdown(self) -> None:
        """The thread ends once the call it runs, if any, has returned."""
        self._calls.put(None)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # the caller's to see, as in a ThreadPoolExecutor
                future.set_exception(exc)
            else:
                future.set_result(result)


def _enter_handler_thread() -> int:
    """Mark the slot's thread as one that runs handlers (``app.call`` refused there)."""
    running_handlers().__enter__()
    return threading.get_ident()


def _bridged(loop: asyncio.AbstractEventLoop, handler: Any, job: Any, session: Any) -> Any:
    """In the slot's thread: run a plain handler in a greenlet whose awaits (its statements,
    on the slot's async connection) are run on the loop. SQLAlchemy's drivers wait through
    the greenlet that marks itself ``__sqlalchemy_greenlet_provider__`` (as its own
    ``greenlet_spawn`` does); this one hands each awaitable to the loop and waits for it."""
    import greenlet

    class _Provider(greenlet.greenlet):
        __sqlalchemy_greenlet_provider__ = True

    context = _Provider(lambda: handler(job, session), greenlet.getcurrent())
    result = context.switch()
    while not context.dead:
        future = asyncio.run_coroutine_threadsafe(_await(result), loop)
        try:
            value = _wait(future)
        except BaseException:  # the statement failed, or the watchdog raised here: the handler's
            result = context.throw(*sys.exc_info())
        else:
            result = context.switch(value)
    return result


def _wait(future: concurrent.futures.Future[Any]) -> Any:
    """The awaitable's result; if the watchdog interrupts the wait, first let the statement
    end on the loop (the connection cannot be left in the middle of one)."""
    try:
        return future.result()
    except BaseException:
        while not future.done():
            concurrent.futures.wait([future])
        raise


async def _await(awaitable: Any) -> Any:
    return await awaitable


class EventLoop:
    """The async worker's event loop, in a thread of its own (the process's main thread keeps
    supervising, and receives the signals)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="dbqueue-event-loop", daemon=True
        )
        self._thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def close(self, engine: AsyncEngine | None) -> None:
        """Dispose of the async engine's connections on the loop, then end the loop."""
        try:
            if engine is not None:
                self.submit(engine.dispose()).result(30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
            if not self.loop.is_running():
                self.loop.close()


class SlotHandle:
    """An async slot as the supervisor sees a thread: ``join(timeout)`` and ``is_alive()``."""

    def __init__(self, future: concurrent.futures.Future[Any], slot: AsyncSlot) -> None:
        self.future = future
        future.add_done_callback(lambda _: slot.close())

    def join(self, timeout: float | None = None) -> None:
        concurrent.futures.wait([self.future], timeout)

    def is_alive(self) -> bool:
        return not self.future.done()


def start_slot(
    loop: EventLoop, engine: AsyncEngine, index: int, main: Callable[[int, AsyncSlot], None]
) -> SlotHandle:
    """Start async slot ``index``: ``main(index, slot)`` (the claim loop) in a greenlet."""
    slot = AsyncSlot(loop.loop, engine, index)
    return SlotHandle(loop.submit(greenlet_spawn(main, index, slot)), slot)

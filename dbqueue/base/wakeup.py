"""Waking idle workers: push where the database (or the lock server) can, polling elsewhere."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.engine import Connection

log = logging.getLogger("dbqueue.wakeup")


class WakeSignal:
    """Idle worker threads sleep on this. A push or a local enqueue wakes one thread (which
    wakes another if it finds a full batch: a cascade, instead of every thread racing for the
    same job); stop() wakes them all.

    A generation counter closes the race between "the claim found nothing" and "start
    waiting": a wake that lands in between makes the wait return at once. ``replan()`` ends
    only the waits that asked for it (the idle poller's, given the ``replans`` count it
    planned with): its sleep was planned on due times that have changed, and nothing is
    runnable yet, so the others sleep on, undisturbed.
    """

    def __init__(self) -> None:
        lock = threading.Lock()
        self._condition = threading.Condition(lock)
        #: Where the waits that a replan ends sleep (same lock): a wake goes to them only
        #: when no other thread waits.
        self._replannable = threading.Condition(lock)
        self._generation = 0
        self._replans = 0
        self._waiting = 0  # threads waiting on _condition
        #: Waiters on an event loop (an async worker's slots): (loop, future) each.
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        #: Those of them that a replan ends too.
        self._replan_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def replans(self) -> int:
        return self._replans

    def replan(self) -> None:
        """End the waits planned before now on due times (``wait(…, replans=…)``)."""
        with self._condition:
            self._replans += 1
            woken, self._replan_waiters = self._replan_waiters, []
            for loop, future in woken:
                loop.call_soon_threadsafe(_resolve, future)
            self._replannable.notify_all()

    def wake(self, everyone: bool = False) -> None:
        with self._condition:
            self._generation += 1
            woken, self._waiters = (
                (self._waiters, []) if everyone else (self._waiters[:1], self._waiters[1:])
            )
            for loop, future in woken:  # from any thread: the loop resolves its own futures
                loop.call_soon_threadsafe(_resolve, future)
            if everyone:
                self._condition.notify_all()
                self._replannable.notify_all()
            elif not woken:
                (self._condition if self._waiting else self._replannable).notify()

    def wait(self, seen: int, timeout: float, replans: int | None = None) -> bool:
        """Sleep up to ``timeout`` unless woken since generation ``seen`` (or, given
        ``replans``, replanned since); True if woken."""
        deadline = time.monotonic() + timeout
        condition = self._condition if replans is None else self._replannable
        with self._condition:
            if replans is None:
                self._waiting += 1
            try:
                while self._generation == seen and replans in (None, self._replans):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    condition.wait(left)
            finally:
                if replans is None:
                    self._waiting -= 1
            return self._generation != seen

    async def wait_async(self, seen: int, timeout: float, replans: int | None = None) -> bool:
        """``wait`` for a coroutine on an event loop: the loop goes on running others."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter = (loop, future)
        with self._condition:
            if self._generation != seen or replans not in (None, self._replans):
                return self._generation != seen
            self._waiters.append(waiter)
            if replans is not None:
                self._replan_waiters.append(waiter)
        try:
            await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            with self._condition:
                for waiters in (self._waiters, self._replan_waiters):
                    if waiter in waiters:
                        waiters.remove(waiter)
        return self._generation != seen


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class LocalWorkers(weakref.WeakSet[Any]):
    """The workers running in this process: its enqueues, requeues and retries tell them
    directly, without waiting for a push or a poll."""

    def wake(self, early: bool = False) -> None:
        """Work is runnable (``early``: once the commit that is under way ends)."""
        for worker in list(self):
            worker.wake(early=early)

    def due_in(self, seconds: float | None) -> None:
        """A job falls due in ``seconds`` (None: none does, e.g. a failure that killed it)."""
        if seconds is not None:
            for worker in list(self):
                worker.due_in(seconds)


class Notifier:
    """How "work is available" travels to idle workers (this base: it does not; they poll)."""

    #: True when workers are pushed to (so the fallback poll can be long).
    pushes: bool = False

    @property
    def wake_mode(self) -> str:
        """How idle workers learn of work, for the worker's first log line."""
        return "push wake-ups" if self.pushes else "polling"

    def start(self, on_wake: Callable[[], None], queues: Sequence[str] = ()) -> None:
        """Begin delivering pushes for ``queues`` to ``on_wake`` (from a background thread)."""

    def stop(self) -> None:
        """Stop delivering pushes."""

    def notify(self, conn: Connection, queues: Sequence[str]) -> int:
        """Push "work available" for these queues (re-notify); returns how many were sent."""
        return 0

    #: True when ``announce_finished`` pushes something (the worker then collects the ids).
    announces_finished: bool = False

    def announce_finished(self, channel: str, job_ids: Sequence[int]) -> None:
        """After the commit that finished these awaited jobs (``app.call``): tell their callers
        through this channel, where it can (the lock server). PostgreSQL's NOTIFY needs none of
        this: the engine sends it inside the transaction."""


#: Seconds before a served notifier's first reconnect, doubling up to MAX_BACKOFF.
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 30.0


class ServedNotifier(Notifier):
    """A notifier served by a thread of its own over a connection of its own (PostgreSQL's
    LISTEN, SQLite's commit watch). The thread reconnects with backoff when the connection
    fails, and ``listening`` is set while it is served: a lost connection costs wake-ups
    (the polls go on), never jobs."""

    #: What a failed connection's warning calls it.
    serves = "the notifier's connection"

    def __init__(self) -> None:
        self.listening = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._backoff = FIRST_BACKOFF

    def _start_serving(self, serve: Callable[[], None], name: str) -> None:
        """Run ``serve`` in a thread until stopped. ``serve`` connects, calls ``_connected``,
        delivers until ``_stop`` is set, and closes; it raises when its connection fails."""
        self._thread = threading.Thread(target=self._serve, args=(serve,), name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _connected(self) -> None:
        self._backoff = FIRST_BACKOFF
        self.listening.set()

    def _serve(self, serve: Callable[[], None]) -> None:
        while not self._stop.is_set():
            try:
                serve()
            except Exception as exc:
                self.listening.clear()
                log.warning("%s failed (%s); retrying in %.1fs", self.serves, exc, self._backoff)
                self._stop.wait(self._backoff)
                self._backoff = min(MAX_BACKOFF, self._backoff * 2)


class PollingOnly(Notifier):
    """No push channel: workers poll, faster while busy, slower while idle."""

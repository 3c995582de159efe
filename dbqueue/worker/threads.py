"""The worker's claim threads (or async slots): started, watched until they end, and replaced
when the watchdog gives one up while the worker runs on."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from dbqueue.worker.aio import EventLoop, SlotHandle, start_slot
from dbqueue.worker.state import RunState
from dbqueue.worker.watchdog import Slot

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

#: How often the supervising thread looks at its threads, the max-runtime deadline and the
#: shutdown timeout.
SUPERVISE_INTERVAL = 0.2


class WorkerThreads:
    """``run(n)`` starts n threads running ``main(index)`` — or, with an event loop, n async
    slots running ``main(index, slot)`` on it — and returns once all have ended, or at once
    when the worker must stop without waiting for them (a second stop request, or the
    shutdown timeout): ``abandon(why)`` then gives them up. ``given_up()`` names the slots the
    watchdog abandoned since it was last asked."""

    def __init__(
        self,
        run_state: RunState,
        main: Callable[..., None],
        given_up: Callable[[], list[Slot]],
        abandon: Callable[[str], None],
        event_loop: EventLoop | None = None,
        async_engine: AsyncEngine | None = None,
    ) -> None:
        self.run_state = run_state
        self.main = main
        self.given_up = given_up
        self.abandon = abandon
        self.event_loop = event_loop
        self.async_engine = async_engine

    def run(self, concurrency: int) -> None:
        live: dict[int, threading.Thread | SlotHandle] = {
            index: self._start(index) for index in range(concurrency)
        }
        next_index = concurrency
        while live:
            deadline = self.run_state.deadline
            if deadline is not None and time.monotonic() >= deadline:
                self.run_state.stop()  # wakes the threads asleep until their next poll, too
            why = self._stops_now()
            if why is not None:
                self.abandon(why)
                return
            for index, thread in list(live.items()):
                thread.join(SUPERVISE_INTERVAL / len(live))
                if not thread.is_alive():
                    del live[index]
            for slot in self.given_up():
                live.pop(slot.index, None)  # left blocked; a daemon, so it cannot hold up exit
                if not self.run_state.stopping:
                    live[next_index] = self._start(next_index)
                    next_index += 1

    def _stops_now(self) -> str | None:
        """Why the worker stops without waiting for its running jobs, if it does."""
        state = self.run_state
        if state.stop_now.is_set():
            return "as asked"
        if state.shutdown_overdue():
            state.stop(now=True)
            return f"its {state.shutdown_timeout:g}s shutdown timeout ran out"
        return None

    def _start(self, index: int) -> threading.Thread | SlotHandle:
        if self.event_loop is not None:  # a slot on the event loop
            assert self.async_engine is not None
            return start_slot(self.event_loop, self.async_engine, index, self.main)
        # Daemon threads: a live worker's threads are all joined above before run() returns;
        # only an abandoned one (blocked in C past its timeout, or running when the worker
        # stopped at once) is left for the exit to end.
        thread = threading.Thread(
            target=self.main, args=(index,), name=f"dbqueue-worker-{index}", daemon=True
        )
        thread.start()
        return thread

"""One lifecycle for background threads: start, stop, join, and signals a test can wait on.

Every long-lived thread of a worker (its heartbeat, watchdog, cancel poller, periodic
scheduler, job log writer, log shipper, maintenance) is a ``Service``: the subclass writes its
loop (``run``) and, where it needs them, what happens before the thread starts and after it
ended; the base owns the thread, the stop request and the signals. Living in the base layer,
it serves maintenance (in the runtime layer) as well as the worker's own services.
"""

from __future__ import annotations

import abc
import threading
from typing import TypeVar

S = TypeVar("S", bound="Service")


class Iterations:
    """How many times a service's loop went round: a test waits for the next round with
    ``wait_for`` instead of sleeping and hoping it came."""

    def __init__(self) -> None:
        self._count = 0
        self._changed = threading.Condition()

    @property
    def count(self) -> int:
        return self._count

    def add(self) -> None:
        with self._changed:
            self._count += 1
            self._changed.notify_all()

    def wait_for(self, count: int, timeout: float | None = None) -> bool:
        """Wait until the loop has gone round ``count`` times in all; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._count >= count, timeout)


class Service(abc.ABC):
    """A background thread named ``name`` with one lifecycle.

    ``start()`` runs ``before_start`` in the caller's thread, then ``run`` in a daemon thread.
    ``stop()`` turns ``stopping`` true (``wait_for_stop`` returns at once), calls ``interrupt``
    for a loop that waits on something else, waits up to ``stop_timeout`` seconds for the
    thread and runs ``after_stop``. Stopping a service that never started does nothing.

    ``started`` / ``stopped`` are set as the thread begins and ends; ``iterations`` counts the
    rounds a loop reports: signals for tests, which must not guess with sleeps.
    """

    #: The thread's name, and the service's in tests and logs.
    name = "dbqueue-service"
    #: How long ``stop()`` waits for the thread; None: until it ends.
    stop_timeout: float | None = 5.0

    def __init__(self) -> None:
        self.started = threading.Event()
        self.stopped = threading.Event()
        self.iterations = Iterations()
        self._stop_requested = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the lifecycle ------------------------------------------------------------------------
    def start(self: S) -> S:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} is started already: a service starts once")
        self.before_start()
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None or self._stop_requested.is_set():
            return
        self._stop_requested.set()
        self.interrupt()
        self.join(self.stop_timeout)
        self.after_stop()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` for the thread to end; True once it has (or never started)."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        return self._stop_requested.is_set()

    def wait_for_stop(self, seconds: float | None) -> bool:
        """Sleep up to ``seconds``, or until ``stop()``; True when stopping."""
        return self._stop_requested.wait(seconds)

    # ---- what a service writes ----------------------------------------------------------------
    @abc.abstractmethod
    def run(self) -> None:
        """The thread's loop: until ``stopping``."""

    def before_start(self) -> None:
        """In ``start()``, before the thread: what must be done when ``start()`` returns."""

    def interrupt(self) -> None:
        """In ``stop()``: wake a loop that waits on something other than ``wait_for_stop``."""

    def after_stop(self) -> None:
        """In ``stop()``, once the thread ended (or ``stop_timeout`` passed)."""

    def _main(self) -> None:
        self.started.set()
        try:
            self.run()
        finally:
            self.stopped.set()

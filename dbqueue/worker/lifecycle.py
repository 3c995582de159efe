"""The parts of a worker's run, started in one declared order and stopped in the reverse."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

log = logging.getLogger("dbqueue.worker")

#: Stops what a step started.
Stop = Callable[[], None]
#: Starts a part of the run and returns how to stop it; None: this run has no such part.
Starter = Callable[[], "Stop | None"]


class Lifecycle:
    """``start()`` runs the steps in their order; ``stop()`` stops what started, last first.

    A step that raises ends the start-up: the steps before it are stopped by ``stop()`` all the
    same. A part that fails to stop does not keep the others running: the first such error is
    raised once every part was stopped (any later one is logged)."""

    def __init__(self, steps: Sequence[tuple[str, Starter]]) -> None:
        self.steps = tuple(steps)
        self._running: list[tuple[str, Stop]] = []

    @property
    def names(self) -> list[str]:
        """Every step's name, in start order."""
        return [name for name, _ in self.steps]

    @property
    def running(self) -> list[str]:
        """The steps started and not stopped yet, in start order."""
        return [name for name, _ in self._running]

    def start(self) -> None:
        for name, start in self.steps:
            stop = start()
            if stop is not None:
                self._running.append((name, stop))

    def stop(self) -> None:
        first_error: Exception | None = None
        while self._running:
            name, stop = self._running.pop()
            try:
                stop()
            except Exception as exc:
                if first_error is None:
                    first_error = exc  # raised below
                else:
                    log.exception("stopping the worker's %s failed", name)
        if first_error is not None:
            raise first_error

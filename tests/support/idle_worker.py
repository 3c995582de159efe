"""A worker running in a thread of the test that polls once an hour: a job it does within a
test's deadline was picked up by a wake-up, not by its poll."""

from __future__ import annotations

import threading
import time

HOUR = 3600.0


class IdleWorker:
    """``with IdleWorker(app, strategy) as idle: …; idle.wait_for(job_id)``; registers the
    task ``wake``, whose jobs it records as done."""

    def __init__(self, app, strategy: str, **options):
        self.done: list[int] = []

        @app.task("wake")
        def wake(job, session):
            self.done.append(job.id)

        self.worker = app.worker(
            strategy=strategy,
            poll_interval=HOUR,
            min_poll_interval=HOUR,
            install_signal_handlers=False,
            maintenance=False,
            **options,
        )
        self.thread = threading.Thread(target=self.worker.run)

    def __enter__(self) -> IdleWorker:
        self.thread.start()
        self.wait_until_idle()
        return self

    def wait_until_idle(self) -> None:
        time.sleep(0.5)  # its first claim finds nothing; it is now asleep for an hour

    def __exit__(self, *exc) -> None:
        self.worker.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()

    def wait_for(self, job_id: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while job_id not in self.done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert job_id in self.done, f"job {job_id} was not picked up: the worker was not woken"

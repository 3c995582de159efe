"""The worker's background services share one lifecycle (``dbqueue.base.service.Service``).

Each service starts, signals (``started``, ``iterations``), stops and joins; stopping one that
never started does nothing. A real worker on SQLite starts its services in its declared order
and stops them in the reverse, observed as it runs. Tests wait on the services' signals, never
on a sleep: the machine may be slow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from support.http_server import RecordingServer

import dbqueue
from dbqueue.base.service import Iterations, Service
from dbqueue.config import MaintenanceSettings
from dbqueue.errors import ConfigurationError
from dbqueue.migrations import migrate
from dbqueue.runtime.maintenance import Maintenance
from dbqueue.worker import WorkerSettings
from dbqueue.worker.heartbeat import Heartbeat
from dbqueue.worker.joblog import JobLogWriter
from dbqueue.worker.lifecycle import Lifecycle
from dbqueue.worker.loki import PUSH_PATH, LokiShipper
from dbqueue.worker.scheduler import Scheduler
from dbqueue.worker.watchdog import CancelPoller, Watchdog

#: Generous: a signal that comes at all comes long before this, however loaded the machine.
WAIT = 30.0

log = logging.getLogger("tests.services")


@pytest.fixture
def app(tmp_path) -> dbqueue.App:
    app = dbqueue.App(f"sqlite:///{tmp_path / 'queue.db'}")
    migrate.upgrade(app.engine, app.names)
    return app


@pytest.fixture
def loki():
    server = RecordingServer()
    server.routes[PUSH_PATH] = lambda request: (204, b"")
    yield server
    server.close()


# ---- each service -------------------------------------------------------------------------------
# name → (app, loki) → (the service, what makes its loop go round once more)
Poke = Callable[[], None]


def _heartbeat(app, loki) -> tuple[Service, Poke]:
    identity = {"name": "test", "queues": ["default"], "concurrency": 1, "strategy": "x"}
    beat = Heartbeat(app.context, app.engine, identity, lambda: [], lambda: (0, 0), 0.01)
    return beat, lambda: None


def _cancel_poller(app, loki) -> tuple[Service, Poke]:
    watchdog = Watchdog(5.0, lambda slot: None)
    store = app.context.cancel_requests()
    return CancelPoller(watchdog, app.engine, store, interval=0.01), lambda: None


def _watchdog(app, loki) -> tuple[Service, Poke]:
    return Watchdog(5.0, lambda slot: None), lambda: None  # it looks at least once a second


def _scheduler(app, loki) -> tuple[Service, Poke]:
    @app.periodic(every=3600, name="hourly")
    @app.task("hourly")
    def hourly(job, session):
        pass

    schedules = app.context.registry.schedules.resolved(app.context.registry)
    return Scheduler(app.context, app.engine, schedules), lambda: None  # checks at once


def _job_log_writer(app, loki) -> tuple[Service, Poke]:
    writer = JobLogWriter(app.context.retry_policy, log_jobs=False)
    return writer, lambda: writer.put([])


def _log_shipper(app, loki) -> tuple[Service, Poke]:
    shipper = LokiShipper(loki.url(PUSH_PATH), "TEST")
    return shipper, lambda: log.warning("a record for Loki")


def _maintenance(app, loki) -> tuple[Service, Poke]:
    context = app.context
    strategy = context.open_strategy(context.check_database(app.engine))
    notifier = context.notifier(strategy, app.engine)
    settings = MaintenanceSettings(tick_seconds=0.01)
    service = Maintenance(context, app.engine, strategy, notifier, settings, "test:maintenance")
    return service, lambda: None


SERVICES = {
    "heartbeat": _heartbeat,
    "cancel poller": _cancel_poller,
    "watchdog": _watchdog,
    "scheduler": _scheduler,
    "job log writer": _job_log_writer,
    "log shipper": _log_shipper,
    "maintenance": _maintenance,
}


@pytest.mark.parametrize("kind", SERVICES)
def test_a_service_starts_signals_stops_and_joins(kind, app, loki):
    service, poke = SERVICES[kind](app, loki)
    assert not service.started.is_set() and not service.is_alive()
    assert service.start() is service
    try:
        assert service.started.wait(WAIT), f"{service.name} did not start"
        assert service.is_alive() and not service.stopping
        poke()
        assert service.iterations.wait_for(1, WAIT), f"{service.name}'s loop did not go round"
        with pytest.raises(RuntimeError, match="started already"):
            service.start()
    finally:
        service.stop()
    assert service.stopping and service.stopped.is_set()
    assert service.join(0) and not service.is_alive()
    service.stop()  # a second stop does nothing


@pytest.mark.parametrize("kind", SERVICES)
def test_stopping_a_service_that_never_started_does_nothing(kind, app, loki):
    service, _ = SERVICES[kind](app, loki)
    service.stop()
    assert service.join(0)
    assert not service.started.is_set() and not service.stopped.is_set()
    assert not service.is_alive() and service.iterations.count == 0


def test_the_heartbeat_registers_before_start_returns_and_unregisters_on_stop(app, loki):
    heartbeat, _ = _heartbeat(app, loki)
    heartbeat.start()
    try:
        assert [worker.id for worker in app.workers()] == [heartbeat.id]
        assert heartbeat.iterations.wait_for(2, WAIT)
    finally:
        heartbeat.stop()
    assert app.workers() == []


def test_the_job_log_writer_writes_what_is_queued_before_it_stops(app):
    writer = JobLogWriter(app.context.retry_policy, log_jobs=False)
    writer.start()
    for _ in range(5):
        writer.put([])
    writer.stop()
    assert writer.iterations.count == 5


def test_iterations_wait_for_a_count_and_time_out_short_of_it():
    iterations = Iterations()
    iterations.add()
    assert iterations.wait_for(1, 0) and iterations.count == 1
    assert not iterations.wait_for(2, 0.01)


# ---- the order --------------------------------------------------------------------------------
def test_lifecycle_stops_what_started_in_reverse_even_when_a_step_fails():
    events: list[str] = []

    def step(name: str, fails_to: str | None = None) -> tuple[str, Callable[[], object]]:
        def stop() -> None:
            events.append(f"stop {name}")
            if fails_to == "stop":
                raise RuntimeError(f"{name} would not stop")

        def start() -> Callable[[], None] | None:
            if fails_to == "start":
                raise RuntimeError(f"{name} would not start")
            events.append(f"start {name}")
            return None if name == "absent" else stop

        return name, start

    lifecycle = Lifecycle(
        [step("a"), step("absent"), step("b", fails_to="stop"), step("c"), step("d", "start")]
    )
    with pytest.raises(RuntimeError, match="d would not start"):
        lifecycle.start()
    assert lifecycle.running == ["a", "b", "c"]
    with pytest.raises(RuntimeError, match="b would not stop"):
        lifecycle.stop()
    assert events == [
        "start a",
        "start absent",
        "start b",
        "start c",
        "stop c",
        "stop b",
        "stop a",  # after b failed to stop
    ]
    assert lifecycle.running == []


def test_a_worker_starts_its_services_in_its_declared_order_and_stops_them_in_reverse(
    tmp_path, loki, monkeypatch
):
    """Every service a worker can run, on a real worker: the calls are recorded as they come,
    with which services were running at that moment."""
    app = dbqueue.App(
        f"sqlite:///{tmp_path / 'queue.db'}",
        environ={"GRAFANA_URL": loki.url(""), "DBQUEUE_MAINTENANCE_TICK": "3600"},
    )
    migrate.upgrade(app.engine, app.names)

    @app.periodic(every=3600, name="hourly")
    @app.task("hourly")
    def hourly(job, session):
        pass

    calls: list[tuple[str, Service, list[Service]]] = []
    seen: list[Service] = []
    start, stop = Service.start, Service.stop

    def running() -> list[Service]:
        return [service for service in seen if service.is_alive()]

    def recorded_start(self):
        calls.append(("start", self, running()))
        seen.append(self)
        return start(self)

    def recorded_stop(self):
        calls.append(("stop", self, running()))
        stop(self)
        assert not self.is_alive(), f"{self.name} still runs after stop()"

    monkeypatch.setattr(Service, "start", recorded_start)
    monkeypatch.setattr(Service, "stop", recorded_stop)
    at_start: list[list[Service]] = []

    @app.on_worker_start
    def started(worker):
        at_start.append(running())
        worker.stop()  # the threads end at once, and the worker shuts down

    worker = app.worker(log_jobs=True, install_signal_handlers=False)
    worker.run()

    assert worker.lifecycle.names == [
        "log shipper",
        "last line",
        "tenant databases",
        "event loop",
        "engine",
        "strategy",
        "notifier",
        "maintenance",
        "cancel requests",
        "scheduler",
        "watchdog",
        "cancel poller",
        "job log writer",
        "heartbeat",
    ]
    by_step = {
        "log shipper": worker.log_shipper,
        "maintenance": worker.maintenance,
        "scheduler": worker.scheduler,
        "watchdog": worker.watchdog,
        "cancel poller": worker.cancel_poller,
        "job log writer": worker.job_log_writer,
        "heartbeat": worker.heartbeat,
    }
    declared = [by_step[name] for name in worker.lifecycle.names if name in by_step]
    assert all(isinstance(service, Service) for service in declared)
    starts = [(service, alive) for call, service, alive in calls if call == "start"]
    stops = [(service, alive) for call, service, alive in calls if call == "stop"]
    assert [service.name for service, _ in starts] == [service.name for service in declared]
    assert [service for service, _ in starts] == declared
    # each started while those before it ran; all ran once the worker had started
    assert [alive for _, alive in starts] == [declared[:n] for n in range(len(declared))]
    assert at_start == [declared]
    # each stopped while those before it still ran, after those after it had ended
    reverse = declared[::-1]
    assert [service for service, _ in stops] == reverse
    assert [alive for _, alive in stops] == [
        declared[: len(declared) - n] for n in range(len(declared))
    ]
    assert all(service.stopped.is_set() for service in declared)
    assert worker.lifecycle.running == []


# ---- the settings -------------------------------------------------------------------------------
def test_a_worker_takes_its_options_or_one_settings_object(app):
    settings = WorkerSettings(concurrency=3, queues=["b", "a", "b"], burst=True)
    worker = dbqueue.Worker(app, options=settings)
    assert worker.options is settings and worker.burst
    assert worker.settings is worker.context.settings  # the App's, as the worker resolved them
    assert worker.concurrency == 3 and worker.queues == ["b", "a"]
    assert not worker.run_maintenance and not worker.run_periodic  # burst
    same = app.worker(concurrency=3, queues=["b", "a", "b"], burst=True)
    assert same.options == settings
    changed = dbqueue.Worker(app, options=settings, concurrency=2)
    assert changed.concurrency == 2 and changed.queues == ["b", "a"]
    with pytest.raises(ConfigurationError, match="concurrency=0 must be a whole number"):
        WorkerSettings(concurrency=0)
    with pytest.raises(ConfigurationError, match="poll_interval=-1 must be a positive number"):
        app.worker(poll_interval=-1)
    with pytest.raises(TypeError):
        app.worker(no_such_option=1)

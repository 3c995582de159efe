"""Queue statistics as the CLI and dashboards show them: every status, zeros included."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Any

from dbqueue.app.running import confirmed, in_flight, listed
from dbqueue.app.targets import target_or_engine
from dbqueue.engine import QueueStats
from dbqueue.job import Status
from dbqueue.runtime.targets import Target, connection_for

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext

#: The keys of ``QueueSummary.by_status``, in the order the CLI prints them: "available" is
#: runnable now, "scheduled" waits for its run_at (both are the ``available`` status),
#: "blocked" waits behind another job of its key.
STATUS_KEYS = (
    "available",
    "scheduled",
    "blocked",
    "running",
    "succeeded",
    "dead",
    "cancelled",
)
assert set(STATUS_KEYS) >= set(Status.ALL)


@dataclasses.dataclass(frozen=True)
class QueueSummary(QueueStats):
    """One queue's ``QueueStats`` (``counts`` as stored: only the statuses it has, scheduled
    jobs counted as available, ``in_flight`` the jobs live workers run while their rows still
    say ``available``) with every status counted as it is, for readers that want no gaps."""

    @classmethod
    def of(cls, stats: QueueStats) -> QueueSummary:
        return cls(**{f.name: getattr(stats, f.name) for f in dataclasses.fields(QueueStats)})

    @property
    def running(self) -> int:
        """The jobs running now, under every strategy (see ``by_status``)."""
        return self.by_status["running"]

    @property
    def by_status(self) -> dict[str, int]:
        """Every key of STATUS_KEYS (0 when none), then any other status a row holds."""
        counts = {key: self.counts.get(key, 0) for key in STATUS_KEYS}
        counts["available"] -= self.scheduled + self.in_flight
        counts["scheduled"] = self.scheduled
        counts["running"] += self.in_flight
        counts.update((k, n) for k, n in self.counts.items() if k not in counts)
        return counts

    def as_dict(self) -> dict[str, Any]:
        """What ``dbqueue stats --json`` prints for the queue."""
        return {
            "queue": self.queue,
            "counts": self.by_status,
            "oldest_runnable_age": self.oldest_runnable_age,
        }


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """One worker process as the registry of live workers knows it (``app.workers()``).

    ``jobs``: the handlers running at its last heartbeat (id, queue, task, attempt, since);
    ``processed`` / ``failed``: attempts it finished / of which failed, since it started;
    ``alive``: its heartbeat has not expired (a gone one is listed only when asked for).
    """

    id: str
    name: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    strategy: str
    started_at: dt.datetime
    heartbeat_at: dt.datetime
    expires_at: dt.datetime
    running: int
    jobs: list[dict[str, Any]]
    processed: int
    failed: int
    alive: bool

    @classmethod
    def of(cls, row: dict[str, Any]) -> WorkerInfo:
        values = {f.name: row.get(f.name) for f in dataclasses.fields(cls)}
        values["queues"] = list(values["queues"] or [])
        values["jobs"] = list(values["jobs"] or [])
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: times as ISO 8601 strings (what ``dbqueue workers --json`` prints)."""
        found = dataclasses.asdict(self)
        for key in ("started_at", "heartbeat_at", "expires_at"):
            found[key] = found[key].isoformat() if found[key] is not None else None
        return found


def worker_infos(engine: Any, conn: Any, include_gone: bool = False) -> list[WorkerInfo]:
    return [WorkerInfo.of(row) for row in engine.workers.worker_rows(conn, include_gone)]


def stats_report(summaries: list[QueueSummary]) -> dict[str, Any]:
    """``/api/v1/stats`` and ``dbqueue stats --json``, in Lowkiq's shape: per queue and in
    total, ``length`` (jobs waiting: runnable now or scheduled), ``morgue_length`` (dead
    jobs) and ``lag`` (seconds the oldest runnable job not running yet has waited; 0 when
    none waits), plus every status's count. Lowkiq's ``by_worker`` is ``by_queue`` here (a
    Lowkiq worker owns one queue)."""
    by_queue = {}
    for summary in summaries:
        counts = summary.by_status
        by_queue[summary.queue] = {
            "length": counts["available"] + counts["scheduled"],
            "morgue_length": counts["dead"],
            "lag": round(summary.oldest_runnable_age or 0.0, 3),
            "counts": counts,
        }
    totals: dict[str, int] = {key: 0 for key in STATUS_KEYS}
    for entry in by_queue.values():
        for key, n in entry["counts"].items():
            totals[key] = totals.get(key, 0) + n
    total = {
        "length": sum(e["length"] for e in by_queue.values()),
        "morgue_length": sum(e["morgue_length"] for e in by_queue.values()),
        "lag": max((e["lag"] for e in by_queue.values()), default=0.0),
        "counts": totals,
    }
    return {"total": total, "by_queue": by_queue}


class Monitoring:
    """The queues' statistics and the registry of live workers, as the CLI and dashboard show
    them."""

    def __init__(self, context: RuntimeContext) -> None:
        self.context = context

    def stats(self, target: Target | None = None) -> list[QueueSummary]:
        """Per queue: ``counts`` (the statuses its rows hold), ``by_status`` (every status,
        zeros included; scheduled apart from available; ``running`` includes the jobs live
        workers report running, under every strategy), the age of the oldest job that waits to
        run (running ones do not wait)."""
        return self.snapshot(target)[0]

    def snapshot(self, target: Target | None = None) -> tuple[list[QueueSummary], list[WorkerInfo]]:
        """``stats`` and the live workers, from one read of the registry: the registry's
        listing, its ids looked up by primary key, then the per-queue counts."""
        with connection_for(target_or_engine(self.context, target)) as conn:
            with self.context.workers_connection(conn) as registry:
                rows = self.context.queue_engine(registry).workers.worker_rows(registry)
            held = in_flight(confirmed(self.context, conn, listed(rows)))
            found = self.context.queue_engine(conn).queries.stats(conn, held)[0]
        return [QueueSummary.of(stats) for stats in found], [WorkerInfo.of(row) for row in rows]

    def workers(
        self, *, include_gone: bool = False, target: Target | None = None
    ) -> list[WorkerInfo]:
        """The worker processes in the registry of live workers, oldest first; with
        ``include_gone`` also those whose heartbeat expired (``alive`` False) that maintenance
        has not deleted yet."""
        with (
            connection_for(target_or_engine(self.context, target)) as conn,
            self.context.workers_connection(conn) as registry,
        ):
            return worker_infos(self.context.queue_engine(registry), registry, include_gone)

    def stats_report(self, target: Target | None = None) -> dict[str, Any]:
        """What ``/api/v1/stats`` and ``dbqueue stats --json`` return, in Lowkiq's shape:
        ``{"total": {...}, "by_queue": {queue: {...}}}``, each with ``length`` (waiting jobs),
        ``morgue_length`` (dead jobs), ``lag`` (seconds) and ``counts`` (every status)."""
        return stats_report(self.stats(target))

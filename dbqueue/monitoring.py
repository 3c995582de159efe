"""Queue statistics as the CLI and dashboards show them: every status, zeros included."""

from __future__ import annotations

import dataclasses
from typing import Any

from .engine import QueueStats
from .job import Status

#: The keys of ``QueueSummary.by_status``, in the order the CLI prints them: "available" is
#: runnable now, "scheduled" waits for its run_at (both are the ``available`` status).
STATUS_KEYS = ("available", "scheduled", "running", "succeeded", "dead", "cancelled")
assert set(STATUS_KEYS) >= set(Status.ALL)


@dataclasses.dataclass(frozen=True)
class QueueSummary(QueueStats):
    """One queue's ``QueueStats`` (``counts`` as stored: only the statuses it has, scheduled
    jobs counted as available) with every status counted, for readers that want no gaps."""

    @classmethod
    def of(cls, stats: QueueStats) -> QueueSummary:
        return cls(**{f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)})

    @property
    def by_status(self) -> dict[str, int]:
        """Every key of STATUS_KEYS (0 when none), then any other status a row holds."""
        counts = {key: self.counts.get(key, 0) for key in STATUS_KEYS}
        counts["available"] -= self.scheduled
        counts["scheduled"] = self.scheduled
        counts.update((k, n) for k, n in self.counts.items() if k not in counts)
        return counts

    def as_dict(self) -> dict[str, Any]:
        """What ``dbqueue stats --json`` prints for the queue."""
        return {
            "queue": self.queue,
            "counts": self.by_status,
            "oldest_runnable_age": self.oldest_runnable_age,
        }


def stats_report(summaries: list[QueueSummary]) -> dict[str, Any]:
    """``/api/v1/stats`` and ``dbqueue stats --json``, in Lowkiq's shape: per queue and in
    total, ``length`` (jobs waiting: runnable now or scheduled), ``morgue_length`` (dead
    jobs) and ``lag`` (seconds the oldest runnable job has waited; 0 when none waits), plus
    every status's count. Lowkiq's ``by_worker`` is ``by_queue`` here (a Lowkiq worker owns
    one queue)."""
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

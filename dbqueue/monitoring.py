"""Queue statistics as the CLI and dashboards show them: every status, zeros included."""

from __future__ import annotations

import dataclasses
from typing import Any

from .engine import QueueStats
from .job import Status

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

"""What running a claimed batch produced: its counts (``BatchResult``, which the worker loop
adds up), and the outcomes of its handler calls before they are written (``Ran``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dbqueue.job import Job


@dataclass
class BatchResult:
    succeeded: int = 0
    failed: int = 0
    skipped: int = 0
    cancelled: int = 0
    #: The jobs' locks went with the outcome's commit (``strategy.releases_with_outcome``).
    released: bool = False
    #: Time spent in the handlers (what sizes the next batch; the claim and commits excluded).
    handler_seconds: float = 0.0


@dataclass
class Ran:
    """What running a batch's handlers produced, before the successes are written."""

    result: BatchResult = field(default_factory=BatchResult)
    done: list[tuple[Job, str | None]] = field(default_factory=list)  # (job, stored value)
    started: list[Job] = field(default_factory=list)
    #: Never started (the worker is stopping), or given back by their batch: as if unclaimed.
    unstarted: list[Job] = field(default_factory=list)
    changed: int = 0  # rows the failures' UPDATEs changed
    #: Rows the outcomes changed, once written (``settle``).
    recorded: int = 0

    @property
    def lost(self) -> bool:
        """Some outcome changed no row: its job is no longer this claim's."""
        return self.recorded != len(self.started)

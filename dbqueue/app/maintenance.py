"""The App's schema and maintenance calls: migrations, and the routines the workers' leader runs
on its schedule (``dbqueue.runtime.maintenance``), run or inspected by hand."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dbqueue.app.targets import target_or_engine
from dbqueue.runtime import maintenance
from dbqueue.runtime.targets import Target, connection_for

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext


class MaintenanceCalls:
    """Creates and upgrades the tables; runs and reports the maintenance routines."""

    def __init__(self, context: RuntimeContext) -> None:
        self.context = context

    def migrate(self, revision: str = "head") -> None:
        """Create or upgrade the queue tables (the same migrations as ``dbqueue migrate``)."""
        from dbqueue.migrations import migrate  # Alembic: loaded when a migration runs

        migrate.upgrade(self.context.engine, self.context.names, revision)

    def run_maintenance(self, routine: str, *, strategy: str | None = None) -> str:
        """Run one maintenance routine now (``purge``, ``rescue`` or ``renotify``), as the
        workers' leader would, recording it; returns what it did. ``strategy`` decides which
        locks tell a live worker from a dead one (default: the database's strategy)."""
        return maintenance.run_once(self.context.reconfigured(strategy=strategy), routine)

    def maintenance_status(self, target: Target | None = None) -> list[dict[str, Any]]:
        """One row per routine: last tick, who ran it, when, how many runs, the result."""
        with connection_for(target_or_engine(self.context, target)) as conn:
            return self.context.queue_engine(conn).housekeeping.maintenance_status(conn)

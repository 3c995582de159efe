"""The queue tables' migrations: Alembic revisions shipped in the package (``versions/``), run on
one version table per queue (``migrate.py``: ``dbqueue migrate``, ``app.migrate()``, the worker's
start-up check), and dbqueue inside an application's own Alembic project (``alembic.py``).

Alembic is loaded here, for every module below, when a migration or a schema check first needs
it. Loading, it announces each of its plugins at INFO, which a command line already logging at
INFO would print before its own one line: they are kept for debug logging only."""

from __future__ import annotations

import logging


def _load_alembic_quietly() -> None:
    announcer = logging.getLogger("alembic.runtime.plugins")
    level = announcer.level
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        announcer.setLevel(logging.WARNING)
    try:
        import alembic  # noqa: F401
    finally:
        announcer.setLevel(level)


_load_alembic_quietly()

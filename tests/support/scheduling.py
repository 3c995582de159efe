"""How the suite is spread over pytest-xdist workers (``make test``: ``--dist loadfile``).

A test file is one unit of work, run whole by one worker (its module fixtures set up once),
except the files in SPREAD: their cases form one unit per database, so that the chaos pairs and
the per-pair process tests of one file run on several workers at once (each worker has tables,
lock servers and private servers of its own). Units start longest first (HEAVIEST; with
``--no-loadscope-reorder``, else pytest-xdist starts the files with the most tests first), so
that no long file starts last while the other workers sit idle at the end of the run.
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadFileScheduling

#: Files of long cases over every database (multi-process ones; the conformance suites, whose
#: fixtures are per database): one unit per database.
SPREAD = {
    "tests/chaos/test_chaos.py",
    "tests/contract/test_processes.py",
    "tests/contract/test_batch_tasks.py",
    "tests/contract/test_keys.py",
    "tests/contract/test_unique.py",
    "tests/contract/test_queue_limits.py",
    "tests/contract/test_periodic.py",
    "tests/test_cli.py",
    "tests/conformance/test_dialect_conformance.py",
    "tests/conformance/test_strategy_conformance.py",
}
#: The longest files (--durations), longest first; the others follow in collection order.
HEAVIEST = [
    "tests/chaos/test_chaos.py",
    "tests/contract/test_processes.py",
    "tests/test_cli.py",
    "tests/contract/test_batch_tasks.py",
    "tests/contract/test_keys.py",
    "tests/contract/test_unique.py",
    "tests/contract/test_queue_limits.py",
    "tests/contract/test_periodic.py",
    "tests/lockserver/test_faults.py",
    "tests/contract/test_async_handlers.py",
    "tests/contract/test_coalesce.py",
    "tests/conformance/test_dialect_conformance.py",
    "tests/conformance/test_strategy_conformance.py",
]
DATABASES = ("postgresql", "mysql", "sqlite", "singlestore")


def order(items: list[pytest.Item]) -> None:
    """The longest files first (every worker collects, and sorts, the same way)."""
    rank = {path: n for n, path in enumerate(HEAVIEST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


class Scheduler(LoadFileScheduling):
    """pytest-xdist's ``loadfile``, with the files of SPREAD cut into one unit per database
    (the database is the first part of a case's id: ``[postgresql-skip_locked-sync]``)."""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        if path in SPREAD and "[" in nodeid:
            database = nodeid.split("[", 1)[1].split("-", 1)[0].rstrip("]")
            if database in DATABASES:
                return f"{path}:{database}"
        return path

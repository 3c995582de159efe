"""The README's plain SQL for "what runs now" (section "What runs now"), run as printed on
PostgreSQL, MariaDB and SQLite against rows a worker's claims and outcomes would leave and a
registry row written by hand: it finds the jobs dbqueue's own readers call running, and the
PostgreSQL backlog query counts only the jobs that wait."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.registry_worker import register_worker, set_job_row

README = Path(__file__).resolve().parents[1] / "README.md"
QUEUE = "readme"
#: The section's blocks in order: PostgreSQL, MySQL/MariaDB, SQLite.
BLOCK = {"postgresql": 0, "mysql": 1, "sqlite": 2}


def readme_statements(database: str, prefix: str) -> list[str]:
    """The section's SQL for ``database``, one string per statement, on the test's tables."""
    text = README.read_text()
    section = text[text.index("### What runs now") :]
    section = section[: section.index("\n## ")]
    block = re.findall(r"```sql\n(.*?)```", section, re.S)[BLOCK[database]]
    block = block.replace("dbqueue_jobs", f"{prefix}jobs")
    return [s.strip() for s in block.split(";\n") if s.strip()]


@pytest.mark.parametrize("database", sorted(BLOCK), indirect=True)
def test_the_readmes_running_query_finds_what_runs(database):
    app = database.app()
    ids = [app.enqueue(None, "readme", {"n": n}, queue=QUEUE) for n in range(5)]
    in_transaction, committed, unlisted, stale, _waiting = ids
    set_job_row(app, committed, status="running", attempt=2, worker_id="hand:1:0")
    set_job_row(app, unlisted, status="running", attempt=1, worker_id="gone:7:0")
    set_job_row(app, stale, attempt=1)  # its first attempt failed; the heartbeat is older
    listing = [(in_transaction, 1), (committed, 2), (stale, 1)]
    jobs = [{"id": i, "queue": QUEUE, "task": "readme", "attempt": a} for i, a in listing]
    for job in jobs:
        job["since"] = "2026-01-01T00:00:00+00:00"
    register_worker(app, "hand:1", jobs, [QUEUE])

    running, *backlog = readme_statements(database.database, database.prefix)
    with app.engine.connect() as conn:
        if database.single_writer:  # the registry is in the side file
            side = app.context.workers_side_engine().url.database
            conn.exec_driver_sql(f"ATTACH DATABASE '{side}' AS side")
        found = {row.id: (row.attempt, row.worker) for row in conn.execute(sa.text(running))}
        waiting = [tuple(row[:2]) for s in backlog for row in conn.execute(sa.text(s))]
    assert found == {
        in_transaction: (1, "hand:1"),
        committed: (2, "hand:1"),
        unlisted: (1, "gone:7:0"),
    }
    assert waiting == ([(QUEUE, 2)] if backlog else [])  # the stale one and the waiting one
    # dbqueue's own readers agree.
    (summary,) = app.stats()
    assert summary.running == 3 and summary.by_status["available"] == 2

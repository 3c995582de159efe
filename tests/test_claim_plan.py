"""The claim query reads the claim index — no table scan, no sort — on PostgreSQL and MariaDB.

A queue table is mostly history: finished jobs far outnumber waiting ones. The claim must go
straight to ``status = 'available' AND queue = ?`` in claim order through ``<jobs>_claim``
(status, queue, priority, run_at, id) and stop at its LIMIT. That matters twice on MySQL/MariaDB:
for speed, and because InnoDB's locking read locks every row it reads, so a claim that scanned
or sorted would lock (and make every other worker skip) far more rows than it takes.

Each test fills tables of its own (prefix ``plan_<random>_``) with 20,000 jobs, 6/7 of them
``succeeded`` and the rest ``available`` across three queues, refreshes the statistics, and
checks the plan of the exact statement the skip_locked worker runs (run ``pytest -s`` to see
it), then that two concurrent claims take the first two jobs in claim order without waiting.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from support.backends import drop_queue_tables

import dbqueue
from dbqueue.job import Job, Status
from dbqueue.strategies.base import Fence

JOBS = 20_000
CHUNK = 2_000
QUEUES = ("q0", "q1", "q2")
AVAILABLE_EVERY = 7  # jobs whose id is a multiple of 7 stay available: ~2,860 of them
LOCK_WAIT_SECONDS = 5  # a blocked second claim fails after this instead of hanging

pytestmark = pytest.mark.parametrize(
    "backend", ["postgresql-skip_locked", "mysql-skip_locked"], indirect=True
)


@pytest.fixture
def filled(backend) -> Iterator[dbqueue.App]:
    prefix = f"plan_{secrets.token_hex(3)}_"
    app = dbqueue.App(backend.url, table_prefix=prefix)
    engine = app.engine
    try:
        app.migrate()
        for start in range(0, JOBS, CHUNK):
            app.enqueue_many(
                engine,
                [
                    {
                        "task": "plan",
                        "queue": QUEUES[i % len(QUEUES)],
                        "priority": 10 * (i % 4),
                        "payload": {"i": i},
                    }
                    for i in range(start, start + CHUNK)
                ],
            )
        jobs = app.names.jobs
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"UPDATE {jobs} SET status = :done, finished_at = run_at "
                    f"WHERE id % {AVAILABLE_EVERY} <> 0"
                ),
                {"done": Status.SUCCEEDED},
            )
        with engine.connect() as conn:
            counts = dict(
                conn.execute(sa.text(f"SELECT status, count(*) FROM {jobs} GROUP BY status")).all()
            )
            if engine.dialect.name == "postgresql":
                conn.execute(sa.text(f"ANALYZE {jobs}"))
            else:
                conn.execute(sa.text(f"ANALYZE TABLE {jobs}")).all()  # answers with a result set
            conn.commit()
        assert sum(counts.values()) == JOBS
        assert 2_500 < counts[Status.AVAILABLE] < 3_500, counts
        yield app
    finally:
        drop_queue_tables(engine, prefix)
        engine.dispose()


def claim_statement(app: dbqueue.App, conn: sa.Connection, queue: str, limit: int) -> sa.Select:
    """Exactly what SkipLockedStrategy.claim executes."""
    return app.queue_engine(conn).claims.runnable(queue, limit).with_for_update(skip_locked=True)


def claim_sql(app: dbqueue.App, conn: sa.Connection, queue: str, limit: int) -> str:
    # The drivers (psycopg2, PyMySQL) interpolate parameters client-side, so the server plans
    # this very text whether the values are bound or rendered as literals.
    stmt = claim_statement(app, conn, queue, limit)
    return str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))


def driver_sql(conn: sa.Connection, run: Any) -> str:
    """The text the driver sends when ``run(conn)`` executes its statement (quoted by the driver
    itself), which is then rolled back."""
    sent: list[tuple[str, Any]] = []

    def capture(conn, cursor, statement, parameters, context, executemany) -> None:
        sent.append((statement, parameters))

    sa.event.listen(conn, "before_cursor_execute", capture)
    try:
        with conn.begin() as transaction:
            run(conn)
            (statement, parameters), *_ = sent
            sql = conn.connection.driver_connection.cursor().mogrify(statement, parameters)
            transaction.rollback()
    finally:
        sa.event.remove(conn, "before_cursor_execute", capture)
    return sql.decode() if isinstance(sql, bytes) else sql


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from plan_nodes(child)


def json_keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from json_keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from json_keys(item)


def json_tables(value: Any) -> Iterator[dict[str, Any]]:
    """Every table access in a MariaDB/MySQL JSON plan, wherever it nests."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "table" and isinstance(item, dict):
                yield item
            yield from json_tables(item)
    elif isinstance(value, list):
        for item in value:
            yield from json_tables(item)


def test_the_claim_reads_the_claim_index(filled, backend):
    app = filled
    jobs = app.names.jobs
    index = f"{jobs}_claim"
    with app.engine.connect() as conn:
        sql = claim_sql(app, conn, "q1", 10)
        assert "SKIP LOCKED" in sql and "LIMIT 10" in sql, sql
        if backend.database == "postgresql":
            (plan,) = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {sql}").scalar_one()
            print(f"\n-- PostgreSQL claim:\n{sql}\n-- plan:\n{json.dumps(plan, indent=1)}")
            nodes = list(plan_nodes(plan["Plan"]))
            kinds = [n["Node Type"] for n in nodes]
            scans = [n for n in nodes if n.get("Relation Name") == jobs]
            assert scans, kinds
            assert all(n["Node Type"] in ("Index Scan", "Index Only Scan") for n in scans), kinds
            assert {n.get("Index Name") for n in scans} == {index}, scans
            assert not any("Seq Scan" in kind for kind in kinds), kinds
            assert "Sort" not in kinds, f"the index should give the claim order: {kinds}"
            assert "LockRows" in kinds, kinds  # FOR UPDATE SKIP LOCKED is in the plan
        else:
            plan = json.loads(conn.exec_driver_sql(f"EXPLAIN FORMAT=JSON {sql}").scalar_one())
            classic = [dict(r._mapping) for r in conn.exec_driver_sql(f"EXPLAIN {sql}")]
            print(f"\n-- MariaDB claim:\n{sql}\n-- plan:\n{json.dumps(plan, indent=1)}")
            print(f"-- classic EXPLAIN: {classic}")
            (table,) = [t for t in json_tables(plan) if t.get("table_name") == jobs]
            assert table.get("key") == index, table
            assert table.get("access_type") in ("ref", "range"), table
            assert table.get("used_key_parts", [])[:2] == ["status", "queue"], table
            assert "filesort" not in set(json_keys(plan)), plan
            (row,) = classic
            assert row["key"] == index and row["type"] in ("ref", "range"), row
            assert "filesort" not in (row["Extra"] or "").lower(), row
            assert "temporary" not in (row["Extra"] or "").lower(), row


def test_a_second_claim_takes_the_next_job_without_waiting(filled, backend):
    app = filled
    engine = app.create_engine()  # configured as the worker's: READ COMMITTED on MySQL/MariaDB
    try:
        with engine.connect() as first, engine.connect() as second:
            for conn in (first, second):
                if backend.database == "postgresql":
                    conn.exec_driver_sql(f"SET lock_timeout = '{LOCK_WAIT_SECONDS}s'")
                else:
                    conn.exec_driver_sql(
                        f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_SECONDS}"
                    )
                    assert conn.get_isolation_level() == "READ COMMITTED"
                conn.commit()
            expected = app.queue_engine(first).claims.candidate_ids(first, "q1", 2)
            first.rollback()
            assert len(expected) == 2

            first.begin()
            taken = first.execute(claim_statement(app, first, "q1", 1)).all()
            second.begin()
            started = time.monotonic()
            other = second.execute(claim_statement(app, second, "q1", 1)).all()
            waited = time.monotonic() - started
            # More of B's claim, while A still holds its lock: none of A's row.
            more = second.execute(claim_statement(app, second, "q1", 10)).all()

            assert [r.id for r in taken] == expected[:1]
            # Not blocked, not empty, not A's row: the next job in claim order, which means A's
            # LIMIT 1 locked one row, not every row its scan touched.
            assert [r.id for r in other] == expected[1:], (taken, other, expected)
            assert waited < LOCK_WAIT_SECONDS / 2, f"the second claim waited {waited:.2f}s"
            assert len(more) == 10 and taken[0].id not in {r.id for r in more}
            assert all(r.queue == "q1" for r in (*taken, *other, *more))
            first.rollback()
            second.rollback()
    finally:
        engine.dispose()


def test_a_batch_completion_finds_its_jobs_by_primary_key_even_without_statistics(backend):
    """A fresh queue table has no statistics until (auto)analyze runs: the planner must still
    find a batch's 10 ids through the primary key, not walk every runnable job's entry in the
    claim index because the guard ``status = 'available'`` names its first column (that made
    each completion read ~1,000 index entries per job with 20,000 jobs queued)."""
    prefix = f"plan_{secrets.token_hex(3)}_"
    app = dbqueue.App(backend.url, table_prefix=prefix)
    engine = app.engine
    try:
        app.migrate()
        ids: list[int] = []
        for start in range(0, JOBS, CHUNK):
            batch = [{"task": "plan", "payload": {"i": i}} for i in range(start, start + CHUNK)]
            ids += app.enqueue_many(engine, batch)
        with engine.connect() as conn:
            queue_engine = app.queue_engine(conn)
            batch = ids[5_000:5_010] or list(range(5_001, 5_011))  # MySQL gives no ids back
            jobs = [Job(id=job_id, started_at=dt.datetime.now(dt.timezone.utc)) for job_id in batch]
            sql = driver_sql(
                conn,
                lambda c: queue_engine.outcomes.complete(
                    c, [(job, None) for job in jobs], Fence(Status.AVAILABLE, 1, "plan")
                ),
            )
            if backend.database == "postgresql":
                (plan,) = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {sql}").scalar_one()
                print(f"\n-- PostgreSQL completion:\n{sql}\n-- plan:\n{json.dumps(plan)}")
                scans = [n for n in plan_nodes(plan["Plan"]) if "Index Name" in n]
                assert {n["Index Name"] for n in scans} == {f"{app.names.jobs}_pkey"}, plan
            else:
                classic = [dict(r._mapping) for r in conn.exec_driver_sql(f"EXPLAIN {sql}")]
                print(f"\n-- MariaDB completion:\n{sql}\n-- plan: {classic}")
                (row,) = classic
                assert row["key"] == "PRIMARY", row
    finally:
        drop_queue_tables(engine, prefix)
        engine.dispose()

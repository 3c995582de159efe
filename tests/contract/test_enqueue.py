"""Transactional enqueue, on every backend: the job commits with the caller's work or not at all."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from support.backends import effects

import dbqueue


def count_jobs(backend) -> int:
    return len(backend.jobs())


def test_session_rollback_leaves_no_job_and_commit_makes_it_visible(backend):
    app = backend.app()
    with Session(app.engine) as session:
        session.begin()
        session.execute(effects.insert().values(job_id=1, note="business change"))
        app.enqueue(session, "t", {"n": 1})
        session.rollback()
    assert count_jobs(backend) == 0
    assert backend.effect_ids() == []

    with Session(app.engine) as session, session.begin():
        session.execute(effects.insert().values(job_id=2, note="business change"))
        job_id = app.enqueue(session, "t", {"n": 2})
    assert [j["id"] for j in backend.jobs()] == [job_id]
    assert backend.effect_ids() == [2]


def test_connection_target_joins_its_transaction(backend):
    app = backend.app()
    with app.engine.connect() as conn:
        conn.begin()
        app.enqueue(conn, "t", {"n": 1})
        # Not visible to another connection before commit.
        other = app.create_engine()
        with other.connect() as peek:
            assert (
                peek.execute(sa.select(sa.func.count()).select_from(app.tables.jobs)).scalar() == 0
            )
        other.dispose()
        conn.rollback()
    assert count_jobs(backend) == 0

    with app.engine.connect() as conn, conn.begin():
        app.enqueue(conn, "t", {"n": 2})
    assert count_jobs(backend) == 1


def test_engine_target_commits_at_once(backend):
    app = backend.app()
    job_id = app.enqueue(app.engine, "t", {"n": 1})
    assert app.get_job(job_id)["status"] == "available"
    job_id = app.enqueue(None, "t", {"n": 2})  # None: the App's own engine
    assert app.get_job(job_id)["task"] == "t"


def test_an_own_transaction_enqueue_is_one_statement_and_leaves_the_connection_as_it_was(
    database,
):
    """``enqueue(None)`` of a job without unique or ordering key is one INSERT, committed on its
    own where the driver can (PostgreSQL: autocommit, no BEGIN or COMMIT sent); a keyed job
    still takes its place and inserts in one transaction. Either way the pooled connection comes
    back transactional: a caller's rollback on it still undoes its enqueue."""
    app = database.app()  # a fresh engine: its one pooled connection is used each time
    seen: list[tuple[str, bool | None]] = []

    def note(conn, cursor, statement, *args) -> None:
        seen.append((statement.split()[0].upper(), getattr(cursor.connection, "autocommit", None)))

    sa.event.listen(app.engine, "before_cursor_execute", note)
    job_id = app.enqueue(None, "t", {"n": 1})
    keyed = app.enqueue(None, "t", {"n": 2}, key="k")
    sa.event.remove(app.engine, "before_cursor_execute", note)
    assert [job["id"] for job in database.jobs()] == [job_id, keyed]
    inserts = [autocommit for verb, autocommit in seen if verb == "INSERT"]
    if database.one_statement_commits_alone:
        assert inserts[0] is True and inserts[-1] is False
    with app.engine.connect() as conn:
        conn.begin()
        app.enqueue(conn, "t", {"n": 3})
        conn.rollback()
    assert [job["id"] for job in database.jobs()] == [job_id, keyed]


def test_options_are_stored(backend):
    app = backend.app()
    job_id = app.enqueue(
        None,
        "send_invoice",
        {"order": 42, "lines": [1, 2]},
        queue="billing",
        priority=10,
        max_attempts=5,
        external_key="order-42",
        origin="shop",
        destination="erp",
        tenant=7,
        business_group="group-a",
    )
    job = app.get_job(job_id)
    assert job["queue"] == "billing"
    assert job["priority"] == 10
    assert job["max_attempts"] == 5
    assert job["external_key"] == "order-42"
    assert job["origin"] == "shop" and job["destination"] == "erp"
    assert job["tenant"] == 7 and job["business_group"] == "group-a"
    assert job["payload"] == {"order": 42, "lines": [1, 2]}
    assert job["status"] == "available" and job["attempt"] == 0 and job["dead"] is False
    assert job["created_at"].tzinfo is not None


def test_defaults(backend):
    app = backend.app()
    job = app.get_job(app.enqueue(None, "t"))
    assert job["queue"] == "default"
    assert job["priority"] == 50
    assert job["max_attempts"] == 20  # the App's default (plain SQL gets the column's 100)
    assert job["payload"] is None


def test_delay_and_run_at(backend):
    app = backend.app()
    delayed = app.get_job(app.enqueue(None, "t", delay=30))
    offset = (delayed["run_at"] - delayed["created_at"]).total_seconds()
    assert 29 <= offset <= 31

    when = dt.datetime(2031, 5, 6, 7, 8, 9, 123000, tzinfo=dt.timezone.utc)
    scheduled = app.get_job(app.enqueue(None, "t", run_at=when))
    assert abs((scheduled["run_at"] - when).total_seconds()) < 0.001

    local = dt.timezone(dt.timedelta(hours=-3))
    scheduled = app.get_job(app.enqueue(None, "t", run_at=when.astimezone(local)))
    assert abs((scheduled["run_at"] - when).total_seconds()) < 0.001


def test_registered_task_defaults_apply(backend):
    app = backend.app()

    @app.task("billing_task", queue="billing", priority=5, max_attempts=3)
    def handler(job, session):
        return None

    job = app.get_job(app.enqueue(None, "billing_task", {}))
    assert (job["queue"], job["priority"], job["max_attempts"]) == ("billing", 5, 3)
    job = app.get_job(app.enqueue(None, "billing_task", {}, queue="other", priority=1))
    assert (job["queue"], job["priority"]) == ("other", 1)


def test_enqueue_many_is_one_statement_and_keeps_order(backend):
    app = backend.app()
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("INSERT"):
            statements.append(statement)

    with app.engine.connect() as conn:
        sa.event.listen(conn, "before_cursor_execute", record)
        with conn.begin():
            ids = app.enqueue_many(conn, [{"task": "bulk", "payload": {"i": i}} for i in range(50)])
    assert len(statements) == 1
    jobs = backend.jobs()
    assert [j["payload"]["i"] for j in jobs] == list(range(50))
    dialect = dbqueue.dialects.for_sqlalchemy(app.engine.dialect)
    if app.engine.dialect.insert_returning and dialect.returns_inserted_ids:
        assert ids == [j["id"] for j in jobs]
    else:  # MySQL 8 and SingleStore: no INSERT … RETURNING
        assert ids == []


def test_enqueue_many_with_mixed_options(backend):
    app = backend.app()
    app.enqueue_many(
        None,
        [
            {"task": "a", "payload": 1},
            {"task": "b", "payload": 2, "delay": 60, "priority": 1},
            {"task": "c", "payload": 3, "queue": "q2"},
        ],
    )
    jobs = {j["task"]: j for j in backend.jobs()}
    assert set(jobs) == {"a", "b", "c"}
    assert (jobs["b"]["run_at"] - jobs["b"]["created_at"]).total_seconds() >= 59
    assert jobs["b"]["priority"] == 1 and jobs["c"]["queue"] == "q2"


def test_enqueue_many_plain_items_take_each_tasks_registered_options(backend):
    """Items without options (the bulk fast path) get their task's registered queue, priority
    and max_attempts, else the App's, exactly as one-by-one enqueues do; a generator works."""
    app = backend.app()

    @app.task("registered_bulk", queue="billing", priority=7, max_attempts=4)
    def registered(job, session):
        return None

    items = [{"task": ("registered_bulk", "loose")[i % 2], "payload": {"i": i}} for i in range(6)]
    ids = app.enqueue_many(None, (item for item in items))
    jobs = backend.jobs()
    assert [(j["task"], j["payload"]) for j in jobs] == [(i["task"], i["payload"]) for i in items]
    expected = {"registered_bulk": ("billing", 7, 4), "loose": ("default", 50, app.max_attempts)}
    for job in jobs:
        assert (job["queue"], job["priority"], job["max_attempts"]) == expected[job["task"]]
        assert job["payload_hash"] == dbqueue.base.payload.payload_hash(
            dbqueue.base.payload.encode(job["payload"])
        )
    if ids:
        assert ids == [j["id"] for j in jobs]


def test_enqueue_many_ids_are_the_rows_ids_after_deletes_and_uneven_increments(database):
    """Where the ids come from lastrowid (SQLite; MariaDB in its default auto-increment mode)
    rather than RETURNING, they are still exactly the new rows' ids: after the newest rows were
    deleted (SQLite reuses their ids), and on MySQL in a session whose auto-increment step is 2
    (not consecutive: RETURNING again). Each size runs twice (the second is precompiled)."""
    app = database.app()
    engine = database.engine()
    returned: list[int] = []
    try:
        for step in (1, 2) if database.ids_follow_session_increment else (1,):
            for call in range(3):
                with engine.connect() as conn:
                    if step == 2:
                        conn.exec_driver_sql("SET SESSION auto_increment_increment = 2")
                        conn.commit()
                    with conn.begin():
                        returned += app.enqueue_many(conn, [{"task": "t", "payload": call}] * 109)
                with app.engine.begin() as conn:  # the newest rows go
                    newest = sa.select(app.tables.jobs.c.id).order_by(app.tables.jobs.c.id.desc())
                    doomed = [row[0] for row in conn.execute(newest.limit(2))]
                    conn.execute(sa.delete(app.tables.jobs).where(app.tables.jobs.c.id.in_(doomed)))
                returned = [i for i in returned if i not in doomed]
    finally:
        engine.dispose()
    stored = [job["id"] for job in database.jobs()]
    assert len(stored) == 107 * (6 if step == 2 else 3)
    if step == 2:
        assert {b - a for a, b in zip(stored[-107:-1], stored[-106:], strict=True)} == {2}
    dialect = dbqueue.dialects.for_sqlalchemy(app.engine.dialect)
    if app.engine.dialect.insert_returning and dialect.returns_inserted_ids:
        assert returned == stored
    else:  # MySQL 8 and SingleStore: no ids
        assert returned == []


AWKWARD = ['"', "\\", '\\"', "{}", "a,b", "NULL", "null", " padded ", "é😀", "", "'; --"]


def test_enqueue_many_stores_awkward_text_and_every_column_type_exactly(backend):
    """Each column's values travel together (PostgreSQL: as one array literal per column), so
    quoting characters, the word NULL, unicode, negative numbers and explicit times must come
    back exactly as given, row by row."""
    app = backend.app()
    run_at = dt.datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone(dt.timedelta(hours=-3)))
    specs = []
    for i, text in enumerate(AWKWARD):
        specs.append(
            {
                "task": f"awk{text}" if text.strip() else f"awk{i}",
                "payload": {"text": text, "list": [text, None, i, -1.5], "flag": i % 3 == 0}
                if i % 4
                else None,
                "external_key": text or None,
                "origin": None if i % 2 else text,
                "tenant": -(2**40) - i if i % 3 else None,
                "priority": -i,
                "run_at": run_at + dt.timedelta(seconds=i),
            }
        )
    ids = app.enqueue_many(None, specs)
    jobs = backend.jobs()
    if ids:
        assert ids == [j["id"] for j in jobs]
    assert len(jobs) == len(specs)
    for spec, job in zip(specs, jobs, strict=True):
        assert job["task"] == spec["task"]
        assert job["payload"] == spec["payload"]
        assert job["external_key"] == spec["external_key"]
        assert job["origin"] == spec["origin"]
        assert job["tenant"] == spec["tenant"]
        assert job["priority"] == spec["priority"]
        assert job["run_at"] == spec["run_at"]


def test_enqueue_many_rolls_back_with_the_caller(backend):
    app = backend.app()
    with Session(app.engine) as session:
        session.begin()
        app.enqueue_many(session, [{"task": "bulk"} for _ in range(10)])
        session.rollback()
    assert count_jobs(backend) == 0


def test_payload_hash_and_find_equivalent(backend):
    app = backend.app()
    first = app.enqueue(None, "sync", {"a": 1, "b": [1, 2]}, external_key="k1")
    app.enqueue(None, "sync", {"a": 2})
    app.enqueue(None, "other", {"a": 1, "b": [1, 2]})
    job = app.get_job(first)
    canonical = '{"a":1,"b":[1,2]}'
    assert job["payload_hash"] == hashlib.sha256(canonical.encode()).hexdigest()

    # Key order does not matter; other tasks and other payloads are not equivalent.
    found = app.find_equivalent(None, "sync", {"b": [1, 2], "a": 1})
    assert [j["id"] for j in found] == [first]
    assert app.find_equivalent(None, "sync", {"a": 3}) == []
    assert [
        j["id"] for j in app.find_equivalent(None, "sync", {"a": 1, "b": [1, 2]}, external_key="k1")
    ] == [first]
    assert app.find_equivalent(None, "sync", {"a": 1, "b": [1, 2]}, external_key="k2") == []
    assert app.find_equivalent(None, "sync", {"a": 1, "b": [1, 2]}, statuses=["succeeded"]) == []


def test_non_serialisable_payload_is_refused_and_loses_nothing(backend):
    app = backend.app()
    with Session(app.engine) as session, session.begin():
        session.execute(effects.insert().values(job_id=1, note="kept"))
        with pytest.raises(dbqueue.PayloadError) as error:
            app.enqueue(session, "t", {"when": dt.datetime.now(), "ok": 1})
        message = str(error.value)
        assert "not JSON-serialisable" in message and "payload['when']" in message
        assert "ISO strings" in message  # says how to fix it
        app.enqueue(session, "t", {"ok": 1})  # the transaction is still usable
    assert count_jobs(backend) == 1
    assert backend.effect_ids() == [1]


def test_oversized_payload_is_refused(backend):
    app = backend.app(max_payload_bytes=100)
    with pytest.raises(dbqueue.PayloadError, match="over the limit of 100 bytes"):
        app.enqueue(None, "t", {"blob": "x" * 200})
    assert count_jobs(backend) == 0


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"queue": "bad queue; drop table"}, "queue name"),
        ({"priority": "high"}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"delay": -1}, "delay"),
        ({"run_at": dt.datetime(2030, 1, 1)}, "time zone"),
        ({"delay": 5, "run_at": dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)}, "either delay"),
        ({"tenant": "seven"}, "tenant"),
    ],
)
def test_bad_options_are_refused_before_touching_the_database(backend, options, fragment):
    app = backend.app()
    with pytest.raises(dbqueue.ConfigurationError, match=fragment):
        app.enqueue(None, "t", {}, **options)
    assert count_jobs(backend) == 0


def test_plain_sql_insert_is_a_valid_job(backend):
    """Monitoring and producers may use plain SQL: the column defaults make a runnable job."""
    app = backend.app()
    with app.engine.begin() as conn:
        conn.execute(
            sa.text(
                f"INSERT INTO {app.names.jobs} (task, payload) VALUES ('plain', '{{\"x\": 1}}')"
            )
        )
    seen = []

    @app.task("plain")
    def plain(job, session):
        seen.append(job.payload)

    backend.run_worker(app)
    assert seen == [{"x": 1}]
    assert backend.jobs()[0]["status"] == "succeeded"


def test_enqueue_many_of_a_size_seen_before_is_precompiled_and_keeps_order(backend):
    """The second call with as many rows (and the same columns) runs a multi-row INSERT
    compiled for that size: still one statement, the rows in order, every value as given, the
    ids those of the rows; with a delay, explicit run_at, optional columns and keys too."""
    app = backend.app()
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("INSERT") and "_jobs " in statement:
            statements.append(statement)

    run_at = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    shapes = {
        "plain": lambda n, i: {"task": "bulk", "payload": {"i": i, "n": n, "s": "é\"\\'"}},
        "delay": lambda n, i: {"task": "bulk", "payload": i, "delay": 30 + i},
        "run_at": lambda n, i: {"task": "bulk", "payload": [i], "run_at": run_at},
        "options": lambda n, i: {
            "task": "bulk",
            "payload": None if i % 2 else {"i": i},
            "queue": "q2",
            "priority": i,
            "external_key": f"ext-{i}",
            "tenant": i,
            "business_group": "bg",
        },
        "keyed": lambda n, i: {"task": "bulk", "payload": i, "key": f"k{i % 2}"},
    }
    expected: dict[int, dict] = {}
    for call in range(2):
        for name, shape in shapes.items():
            items = [shape(call, i) for i in range(7)]
            with app.engine.connect() as conn:
                sa.event.listen(conn, "before_cursor_execute", record)
                before = len(statements)
                with conn.begin():
                    ids = app.enqueue_many(conn, items)
                assert len(statements) - before == 1, (name, statements[before:])
            if ids:
                assert ids == sorted(ids) and len(ids) == 7
                expected.update(zip(ids, items, strict=True))
    jobs = {job["id"]: job for job in backend.jobs()}
    assert len(jobs) == 2 * 7 * len(shapes)
    if expected:  # the ids returned are those of the rows with these values
        for job_id, item in expected.items():
            job = jobs[job_id]
            assert job["payload"] == item["payload"]
            assert job["queue"] == item.get("queue", "default")
            assert job["priority"] == item.get("priority", 50)
            assert job["external_key"] == item.get("external_key")
            assert job["tenant"] == item.get("tenant")
            if "run_at" in item:
                assert job["run_at"] == run_at
            if "delay" in item:
                assert (job["run_at"] - job["created_at"]).total_seconds() >= item["delay"] - 1
    blocked = [j for j in jobs.values() if j["status"] == "blocked"]
    assert len(blocked) == 2 * 7 - 2  # two lines of keyed jobs: one head each

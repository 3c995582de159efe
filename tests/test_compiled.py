"""The worker's hot statements, run on the DBAPI cursor, behave as ``Connection.execute`` does:
same rows and values, same row counts, cursor events fire, and a lost connection is invalidated
and raised as SQLAlchemy's error (the worker's reconnect logic depends on that)."""

from __future__ import annotations

import copy
import datetime as dt
import pickle

import pytest
import sqlalchemy as sa

from dbqueue.engine import compiled as compiled_module
from dbqueue.engine.compiled import CompiledStatement
from dbqueue.job import LAZY, ROW_FIELDS, Job, Status, row_reader
from dbqueue.schema.types import UtcDateTime


@pytest.fixture(params=["cursor", "fallback"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of executing: SQLAlchemy's cursor execution, and the public fallback."""
    if request.param == "fallback":
        monkeypatch.setattr(compiled_module, "_CURSOR_EXECUTE", None)
    return request.param


def _enqueue_three(app, engine: sa.Engine) -> list[int]:
    later = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    return [
        app.enqueue(engine, "a", {"n": 1, "text": "é\"'\\"}, priority=10),
        app.enqueue(engine, "b", None, external_key="k", tenant=-7),
        app.enqueue(engine, "c", [1, 2.5, None], run_at=later, origin="here"),
    ]


def test_a_compiled_claim_reads_the_rows_connection_execute_reads(database, path):
    app = database.app()
    engine = app.create_engine()
    ids = _enqueue_three(app, engine)
    with engine.connect() as conn, conn.begin():
        queue_engine = app.queue_engine(conn)
        stmt = queue_engine.claims.runnable()
        params = {"queue": "default", "limit": 10}
        expected = [tuple(row)[:-1] for row in conn.execute(stmt, params).all()]
        compiled = queue_engine.sql.compiled(stmt)
        got = [tuple(compiled.process(row))[:-1] for row in compiled.raw_rows(conn, params)]
    engine.dispose()
    assert sorted(row[0] for row in got) == sorted(ids)
    assert got == expected
    payloads = {row[0]: row[3] for row in got}
    assert payloads[ids[0]] == {"n": 1, "text": "é\"'\\"}
    assert payloads[ids[1]] is None and payloads[ids[2]] == [1, 2.5, None]
    run_at = next(row[7] for row in got if row[0] == ids[2])
    assert run_at.tzinfo is dt.timezone.utc


def test_a_compiled_statement_returns_the_rowcount_and_fires_cursor_events(database, path):
    app = database.app()
    engine = app.create_engine()
    ids = _enqueue_three(app, engine)
    sent: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *args: sent.append(args[2]))
    jobs = app.tables.jobs.c
    stmt = (
        sa.update(app.tables.jobs)
        .where(jobs.id.in_([sa.bindparam("first"), sa.bindparam("second")]))
        .values(status=Status.SUCCEEDED, message=sa.bindparam("note"))
    )
    with engine.connect() as conn, conn.begin():
        compiled = CompiledStatement(stmt, conn.dialect)
        changed = compiled.rowcount(conn, {"first": ids[0], "second": ids[2], "note": "x"})
    rows = {row["id"]: (row["status"], row["message"]) for row in database.jobs()}
    engine.dispose()
    assert changed == 2
    assert rows[ids[0]] == rows[ids[2]] == ("succeeded", "x")
    assert rows[ids[1]] == ("available", None)
    assert compiled.sql in sent


def test_a_statement_with_an_expanding_in_is_refused(database):
    app = database.app()
    jobs = app.tables.jobs.c
    stmt = sa.select(jobs.id).where(jobs.id.in_(sa.bindparam("ids", expanding=True)))
    with pytest.raises(ValueError, match="expanding IN"):
        CompiledStatement(stmt, app.create_engine().dialect)


@pytest.mark.parametrize("backend", ["postgresql-skip_locked", "mysql-skip_locked"], indirect=True)
def test_a_lost_connection_is_invalidated_and_raised_as_sqlalchemy_error(backend, path):
    app = backend.app()
    engine = app.create_engine()
    with engine.connect() as conn:
        conn.begin()
        queue_engine = app.queue_engine(conn)
        compiled = queue_engine.sql.compiled(queue_engine.claims.runnable())
        assert queue_engine.dialect.end_connection(engine, conn.connection.dbapi_connection)
        with pytest.raises(sa.exc.DBAPIError) as raised:
            compiled.raw_rows(conn, {"queue": "default", "limit": 10})
        assert raised.value.connection_invalidated
        assert conn.invalidated
    engine.dispose()


def test_a_precompiled_enqueue_returns_the_id_of_its_row(database, path):
    app = database.app()
    engine = app.create_engine()
    with engine.connect() as conn, conn.begin():
        first = app.enqueue(conn, "first", {"n": 1})
        delayed = app.enqueue(conn, "delayed", {"n": 2}, delay=60, external_key="k")
    engine.dispose()
    assert delayed > first
    assert app.get_job(first)["task"] == "first"
    assert (app.get_job(delayed)["task"], app.get_job(delayed)["external_key"]) == ("delayed", "k")


def test_the_claims_row_reader_builds_the_jobs_from_tuple_builds(database):
    """The generated reader (processors applied as it fills a Job) against the general path:
    every attribute of every Job the same, the attempt counted the same."""
    app = database.app()
    engine = app.create_engine()
    ids = _enqueue_three(app, engine)
    with engine.connect() as conn, conn.begin():
        queue_engine = app.queue_engine(conn)
        compiled = queue_engine.sql.compiled(queue_engine.claims.runnable())
        read = row_reader(compiled.result_processors)
        rows = compiled.raw_rows(conn, {"queue": "default", "limit": 10})
        expected = [Job.from_tuple(compiled.process(row), 1).as_dict() for row in rows]
        got = [read(row, 1).as_dict() for row in rows]
        bad = list(rows[0])
        bad[ROW_FIELDS.index("max_attempts")] = "three"
        with pytest.raises(TypeError, match="max_attempts is 'three', not a whole number"):
            read(tuple(bad), 1)
    engine.dispose()
    assert sorted(job["id"] for job in got) == sorted(ids)
    assert got == expected
    assert all(job["attempt"] == 1 and job["run_at"].tzinfo is dt.timezone.utc for job in got)


def test_a_claimed_jobs_lazy_columns_hold_the_claimed_values(database):
    """The columns a claimed Job converts on first read come from the row it was claimed with
    (not the table's row as it is by then), and a value set on the Job before stays."""
    app = database.app()
    engine = app.create_engine()
    ids = _enqueue_three(app, engine)
    jobs = app.tables.jobs
    with engine.connect() as conn, conn.begin():
        queue_engine = app.queue_engine(conn)
        compiled = queue_engine.sql.compiled(queue_engine.claims.runnable())
        read = row_reader(compiled.result_processors)
        rows = compiled.raw_rows(conn, {"queue": "default", "limit": 10})
        claimed = {job.id: job for job in (read(row, 1) for row in rows)}
        conn.execute(sa.update(jobs).values(origin="changed", message="changed", tenant=99))
        kept = claimed[ids[0]]
        kept.message = "set on the job"
    engine.dispose()
    assert sorted(claimed) == sorted(ids)
    assert kept.message == "set on the job" and kept.origin is None and kept.tenant is None
    assert (claimed[ids[1]].tenant, claimed[ids[1]].external_key) == (-7, "k")
    assert (claimed[ids[2]].origin, claimed[ids[2]].message) == ("here", None)
    for job in claimed.values():
        assert job.status == Status.AVAILABLE and job.created_at.tzinfo is dt.timezone.utc
        assert set(LAZY) <= set(job.as_dict())
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        kept.nothing  # noqa: B018 - the attribute read is the test
    copied = pickle.loads(pickle.dumps(claimed[ids[2]]))
    assert copied.as_dict() == claimed[ids[2]].as_dict() == copy.copy(claimed[ids[2]]).as_dict()


def test_sqlite_timestamp_text_reads_as_aware_utc_whatever_its_form(tmp_path):
    """SQLite stores timestamps as text, and a hand-written row may hold any: the fast path
    (one fromisoformat) reads what the type's full chain reads, and leaves it the rest."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'times.db'}")
    table = sa.Table(
        "times", sa.MetaData(), sa.Column("n", sa.Integer), sa.Column("at", UtcDateTime)
    )
    utc = dt.timezone.utc
    cases = {
        "2026-11-24 04:20:32.123456": dt.datetime(2026, 11, 24, 4, 20, 32, 123456, tzinfo=utc),
        "2026-11-24 04:20:32.123": dt.datetime(2026, 11, 24, 4, 20, 32, 123000, tzinfo=utc),
        "2026-11-24 04:20:32": dt.datetime(2026, 11, 24, 4, 20, 32, tzinfo=utc),
        "2026-11-24 06:20:32+02:00": dt.datetime(2026, 11, 24, 4, 20, 32, tzinfo=utc),
        "2026-11-24": dt.datetime(2026, 11, 24, tzinfo=utc),
        "not a time": None,
    }
    with engine.begin() as conn:
        table.create(conn)
        for n, text in enumerate(cases):
            conn.execute(
                sa.text("INSERT INTO times (n, at) VALUES (:n, :at)"), {"n": n, "at": text}
            )
        read = [at for _, at in conn.execute(sa.select(table).order_by(table.c.n))]
    engine.dispose()
    assert read == list(cases.values())
    assert all(at.tzinfo is utc for at in read if at is not None)


@pytest.mark.parametrize("dialect_name", ["sqlite", "postgresql", "mysql"])
def test_flat_rows_bind_exactly_what_rows_of_dicts_bind(dialect_name):
    """``flat_parameters`` (a bulk enqueue's rows as one list, in the caller's column order)
    gives the driver the same parameters as ``parameters`` given every bind by name, also where
    the SQL orders the columns differently from the caller and a column has a bind processor."""
    from sqlalchemy.dialects import mysql, postgresql, sqlite

    dialect = {"sqlite": sqlite, "postgresql": postgresql, "mysql": mysql}[dialect_name].dialect()
    table = sa.Table(
        "t",
        sa.MetaData(),
        sa.Column("a", sa.Integer),
        sa.Column("b", sa.String(10)),
        sa.Column("c", sa.Boolean),
    )
    keys = ("c", "b", "a")  # not the table's (and so the SQL's) order
    rows = [{"c": True, "b": "x", "a": 1}, {"c": False, "b": "y", "a": 2}]
    values = [
        {key: sa.bindparam(f"{key}__{index}", type_=table.c[key].type) for key in keys}
        for index in range(len(rows))
    ]
    compiled = CompiledStatement(sa.insert(table).values(values), dialect)
    flat = [row[key] for row in rows for key in keys]
    by_name = {f"{key}__{index}": row[key] for index, row in enumerate(rows) for key in keys}
    expected = compiled.parameters(by_name)
    found = compiled.flat_parameters(keys, len(rows), flat)
    if isinstance(expected, tuple):  # positional: a tuple, or the flat list itself
        found = tuple(found)
    assert found == expected


@pytest.mark.parametrize("dialect_name", ["sqlite", "postgresql", "mysql"])
def test_payloads_reach_the_driver_as_exact_str(dialect_name):
    """The payload column's bind processor hands the driver an exact ``str``, never the
    ``EncodedPayload`` subclass (sqlite3 looks an adapter up for a subclass, psycopg2 walks its
    MRO), with the same text; a payload not yet encoded is encoded."""
    from sqlalchemy.dialects import mysql, postgresql, sqlite

    from dbqueue.base.payload import EncodedPayload
    from dbqueue.schema.types import JsonText, NativeJson

    dialect = {"sqlite": sqlite, "postgresql": postgresql, "mysql": mysql}[dialect_name].dialect()
    for column_type in (JsonText(), NativeJson("JSONB")):
        process = column_type.bind_processor(dialect)
        for given, text in (
            (EncodedPayload('{"a":1}'), '{"a":1}'),
            ({"b": 2, "a": 1}, '{"a":1,"b":2}'),
        ):
            bound = process(given)
            assert type(bound) is str and bound == text
        assert process(None) is None

"""Conformance of every database module: each public member of ``dbqueue.dialects.base.Dialect``
exercised on a real connection of every database, where it does something; a capability the
database lacks is asserted as lacking. A new database module passes this file (and
``test_every_member_of_dialect_has_a_conformance_test`` keeps it complete).

The tables here are scratch tables of this module's own (built from the dialect's column types
and table options); the queue's tables are used only where a member acts on them (the insert
trigger, the version table, enqueue's statements), in queues of this module's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations
from support.backends import BACKENDS, Backend
from support.conformance import Checklist
from support.waiting import wait_for

import dbqueue
from dbqueue import dialects, strategies
from dbqueue.base import results
from dbqueue.base.wakeup import PollingOnly
from dbqueue.dialects import WRITE_INTENT, Dialect
from dbqueue.errors import ConfigurationError, StrategyNotSupportedError
from dbqueue.schema.types import JsonText, UtcDateTime
from dbqueue.strategies.advisory_lock import AdvisoryLockStrategy
from dbqueue.strategies.skip_locked import SkipLockedStrategy
from dbqueue.tasks.failures import MAX_KEPT_ERRORS, AttemptError

CHECKLIST = Checklist(Dialect)
covers = CHECKLIST.covers
CHECKLIST.elsewhere(
    "statements_together",
    "dialects/test_transactions.py::test_statements_together_commit_as_one_and_roll_back_as_one",
)
UTC = dt.timezone.utc
#: The queue this module's jobs go in (the queue tables are the session's).
QUEUE = "conformance"


@dataclass
class Connected:
    """One database: its backend, an engine dbqueue configured, its connected Dialect, and two
    scratch tables (``rows``: an id, text, a priority, two timestamps and a payload; ``counts``:
    a text key, an owner and a counter)."""

    backend: Backend
    engine: sa.Engine
    dialect: Dialect
    rows: sa.Table
    counts: sa.Table

    @property
    def cls(self) -> type[Dialect]:
        return type(self.dialect)

    def committed(self) -> list[str]:
        """The names in ``rows`` another connection sees: what is committed."""
        with self.engine.connect() as conn:
            return list(conn.execute(sa.select(self.rows.c.name)).scalars())

    @contextlib.contextmanager
    def impatient(self, seconds: int = 1) -> Iterator[sa.Engine]:
        """An engine whose connections give up on a lock after ``seconds``."""
        engine = self.backend.impatient_engine(seconds)
        try:
            yield engine
        finally:
            engine.dispose()


@pytest.fixture(scope="module")
def connected(each_database: Backend) -> Iterator[Connected]:
    engine = dialects.create_engine(each_database.url)
    with engine.connect() as conn:
        dialect = dialects.for_sqlalchemy(conn.dialect)
        options = dialect.table_options(conn, "id")
        keyed_options = dialect.table_options(conn, "k")
    types = dialect.database_types()
    timestamp = types.timestamp if types.timestamp is not None else sa.DateTime()
    metadata = sa.MetaData()
    prefix = each_database.prefix
    rows = sa.Table(
        f"{prefix}conf_rows",
        metadata,
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(64)),
        sa.Column("priority", sa.Integer()),
        sa.Column("run_at", timestamp),
        sa.Column("created_at", timestamp, server_default=sa.DefaultClause(types.server_now)),
        sa.Column("payload", types.payload if types.payload is not None else JsonText()),
        **options,
    )
    counts = sa.Table(
        f"{prefix}conf_counts",
        metadata,
        sa.Column("k", sa.String(64), primary_key=True, autoincrement=False),
        sa.Column("owner", sa.Integer()),
        sa.Column("counter", sa.Integer(), nullable=False),
        **keyed_options,
    )
    with engine.begin() as conn:
        metadata.drop_all(conn)
        metadata.create_all(conn)
    try:
        yield Connected(each_database, engine, dialect, rows, counts)
    finally:
        with engine.begin() as conn:
            metadata.drop_all(conn)
        engine.dispose()


@pytest.fixture
def db(connected: Connected) -> Connected:
    """The database, its scratch tables empty."""
    with connected.engine.begin() as conn:
        conn.execute(connected.rows.delete())
        conn.execute(connected.counts.delete())
    return connected


def utc(expression: Any) -> Any:
    """A timestamp expression read as dbqueue reads them: an aware UTC datetime."""
    return sa.type_coerce(expression, UtcDateTime())


def add_rows(db: Connected, *names: str) -> list[int]:
    """Insert a row per name, each its own statement, committed; their ids."""
    ids = []
    with db.engine.begin() as conn:
        for name in names:
            ids.append(conn.execute(sa.insert(db.rows).values(name=name)).inserted_primary_key[0])
    return ids


def overrides(cls: type[Dialect], member: str) -> bool:
    return getattr(cls, member) is not getattr(Dialect, member)


@pytest.fixture
def app(db: Connected) -> Iterator[dbqueue.App]:
    """An App on the session's queue tables of this database; this module's queue emptied."""
    app = db.backend.app()
    yield app
    with app.engine.begin() as conn:
        conn.execute(sa.delete(app.tables.jobs).where(app.tables.jobs.c.queue == QUEUE))
    app.engine.dispose()


# ---- the checklist -------------------------------------------------------------------------
def test_every_member_of_dialect_has_a_conformance_test() -> None:
    assert CHECKLIST.problems(globals()) == []


def test_every_dialect_class_is_tested() -> None:
    """Every database module dbqueue has runs here (through the backend that stands for it)."""
    tested = {spec.dialect_class for spec in BACKENDS.values() if spec.is_default}
    assert tested == set(dialects.DIALECT_CLASSES)


# ---- which module, which URL ---------------------------------------------------------------
@covers("name", "sqlalchemy_names", "url_aliases")
def test_names_and_aliases_select_this_module(db: Connected) -> None:
    cls = db.cls
    assert dialects.BY_NAME[cls.name] is cls
    assert db.engine.dialect.name in cls.sqlalchemy_names
    for name in cls.sqlalchemy_names:
        assert dialects.class_for_sqlalchemy_name(name) is cls
    url = sa.engine.make_url(db.backend.url)
    for alias in cls.url_aliases:  # a spelling SQLAlchemy does not load, made one it does
        aliased = url.set(drivername=alias)
        assert dialects.class_for_url(aliased) is cls
        assert cls.normalize_url(aliased).get_dialect().name in cls.sqlalchemy_names


@covers("url_driver", "default_port")
def test_a_url_built_from_db_variables_connects(db: Connected) -> None:
    """The seed's DB_HOST/DB_PORT/… variables make a URL with this module's driver and, with
    no DB_PORT, its default port."""
    cls, url = db.cls, sa.engine.make_url(db.backend.url)
    given = {
        "DB_HOST": url.host,
        "DB_BASE": url.database,
        "DB_USER": url.username,
        "DB_PASS": url.password,
        "DB_PORT": None if url.port in (None, cls.default_port) else str(url.port),
    }
    built = sa.engine.make_url(
        dialects.resolve_url(None, cls.name, {k: v for k, v in given.items() if v})
    )
    assert built.drivername == cls.url_driver
    assert built.port == (url.port or cls.default_port)
    engine = dialects.create_engine(built)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.literal(1))).scalar_one() == 1
    finally:
        engine.dispose()


@covers("default_strategy")
def test_the_default_strategy_is_supported_here(db: Connected) -> None:
    chosen = strategies.resolve(None, db.dialect)
    assert chosen.name == db.cls.default_strategy
    chosen.check_supported(db.dialect)  # raises if the server cannot


@covers("async_driver", "async_url")
def test_the_asyncio_driver_connects_or_its_absence_is_named(db: Connected) -> None:
    cls, url = db.cls, sa.engine.make_url(db.backend.url)
    async_url = cls.async_url(url)
    if cls.async_driver is None:
        assert async_url is None
        with pytest.raises(ConfigurationError, match=f"{cls.name} has no asyncio driver"):
            dialects.create_async_engine(url)
        return
    assert async_url is not None and async_url.drivername.endswith(f"+{cls.async_driver}")

    async def select_one() -> int:
        engine = dialects.create_async_engine(url)
        try:
            async with engine.connect() as conn:
                return (await conn.execute(sa.select(sa.literal(1)))).scalar_one()
        finally:
            await engine.dispose()

    assert asyncio.run(select_one()) == 1


@covers("sync_drivers", "sync_url")
def test_the_asyncio_drivers_url_turns_into_a_sync_one_that_connects(db: Connected) -> None:
    """An async URL where a sync engine is needed becomes the same database's sync driver (one
    this module names for each async driver it knows); an unknown driver maps to nothing."""
    cls, url = db.cls, sa.engine.make_url(db.backend.url)
    assert cls.sync_url(url.set(drivername=f"{url.get_backend_name()}+nosuchdriver")) is None
    async_url = cls.async_url(url)
    if async_url is None:  # no async path: nothing to turn back
        assert cls.async_driver is None
        return
    assert cls.sync_drivers.get(cls.async_driver) is not None
    sync_url = cls.sync_url(async_url)
    assert sync_url is not None and sync_url.drivername != async_url.drivername
    engine = sa.create_engine(sync_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.literal(1))).scalar_one() == 1
    finally:
        engine.dispose()


@covers("connection_lost")
def test_a_connection_the_server_closed_is_told_from_a_bug(db: Connected) -> None:
    """Where the dialect says a driver error outside SQLAlchemy's means a lost connection, a
    real one does (the async driver's, on a connection that is gone); nothing else does."""
    d = db.dialect
    assert not d.connection_lost(RuntimeError("connection is closed"))
    assert not d.connection_lost(ValueError("boom"))
    if not overrides(db.cls, "connection_lost"):
        return  # its drivers' errors reach the worker as SQLAlchemy's DBAPIError
    url = sa.engine.make_url(db.backend.url)

    async def closed_connection_error() -> BaseException:
        engine = dialects.create_async_engine(url)
        try:
            async with engine.connect() as conn:
                raw = (await conn.get_raw_connection()).driver_connection
                await raw.close()
                try:
                    await raw.execute("select 1")
                except Exception as exc:
                    return exc
                raise AssertionError("a closed connection ran a statement")
        finally:
            await engine.dispose()

    assert d.connection_lost(asyncio.run(closed_connection_error()))


@covers("server_description")
def test_the_server_description_names_its_version(db: Connected) -> None:
    version = db.dialect.server_version
    assert version and all(isinstance(part, int) for part in version)
    assert ".".join(map(str, version)) in db.dialect.server_description


@covers("check_url", "normalize_url")
def test_urls_are_normalized_to_a_loaded_driver_and_unusable_ones_refused(db: Connected) -> None:
    cls, url = db.cls, sa.engine.make_url(db.backend.url)
    cls.check_url(url)  # the suite's own URL is usable
    bare = url.set(drivername=url.drivername.partition("+")[0])  # no driver named
    normal = cls.normalize_url(bare)
    assert dialects.class_for_url(normal) is cls
    assert cls.normalize_url(normal) == normal
    engine = sa.create_engine(normal, **cls.engine_kwargs())
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.literal(1))).scalar_one() == 1
    finally:
        engine.dispose()
    # A database file that no other connection would see: refused where the database is a file.
    in_memory = url.set(database=":memory:")
    if cls.default_port is None:
        with pytest.raises(ConfigurationError, match="in-memory"):
            cls.check_url(in_memory)
    else:
        cls.check_url(in_memory)  # a server's database of that name is still a shared one


# ---- engines and connections ---------------------------------------------------------------
@covers("engine_kwargs", "configure_engine")
def test_engine_options_and_hooks_apply_to_its_connections(db: Connected) -> None:
    """The options are create_engine's (an isolation level is the connections'); the hooks
    make a write-intent transaction hold the write lock from its start where one writer at a
    time is admitted, and lock nothing elsewhere."""
    cls = db.cls
    options = cls.engine_kwargs()
    engine = sa.create_engine(cls.normalize_url(sa.engine.make_url(db.backend.url)), **options)
    cls.configure_engine(engine)
    intent = engine.execution_options(**{WRITE_INTENT: True})
    try:
        with intent.connect() as holder, db.impatient() as impatient:
            if "isolation_level" in options:
                assert holder.get_isolation_level() == options["isolation_level"]
            holder.begin()  # nothing read or written yet
            with impatient.connect() as other:
                write = sa.insert(db.rows).values(name="beside")
                if db.dialect.single_writer:
                    with pytest.raises(sa.exc.OperationalError) as locked:
                        other.execute(write)
                    assert db.dialect.is_transient(locked.value)
                else:
                    other.execute(write)
                    other.commit()
            holder.rollback()
    finally:
        engine.dispose()


@covers("check_connection")
def test_check_connection_passes_dbqueue_s_connections_and_refuses_others(db: Connected) -> None:
    with db.engine.connect() as conn:
        db.dialect.check_connection(conn)
    # The driver as SQLAlchemy sets it up without dbqueue's URL and engine set-up: refused
    # where the module checks connections (SingleStore's driver autocommits by default).
    plain = sa.create_engine(sa.engine.make_url(db.backend.url))
    try:
        with plain.connect() as conn:
            if overrides(db.cls, "check_connection"):
                with pytest.raises(ConfigurationError):
                    db.dialect.check_connection(conn)
            else:
                db.dialect.check_connection(conn)
    finally:
        plain.dispose()


@covers("end_connection")
def test_end_connection_rolls_back_a_stuck_transaction_and_frees_its_locks(db: Connected) -> None:
    [row] = add_rows(db, "before")
    victim = db.engine.connect()
    try:
        victim.begin()
        victim.execute(sa.update(db.rows).where(db.rows.c.id == row).values(name="stuck"))
        assert db.dialect.end_connection(db.engine, victim.connection.dbapi_connection) is True
        with db.impatient(30) as impatient, impatient.begin() as other:  # waits for it to end
            other.execute(sa.update(db.rows).where(db.rows.c.id == row).values(name="after"))
        with pytest.raises(sa.exc.DBAPIError):
            victim.execute(sa.select(sa.literal(1)))
    finally:
        victim.invalidate()
        victim.close()
    assert db.committed() == ["after"]


# ---- the clock -----------------------------------------------------------------------------
@covers("now", "now_plus")
def test_now_is_the_utc_clock_of_each_statement_and_now_plus_moves_it(db: Connected) -> None:
    d = db.dialect
    shift = sa.bindparam("shift", type_=sa.Float())
    with db.engine.connect() as conn:
        found = conn.execute(
            sa.select(
                utc(d.now()), utc(d.now_plus(90)), utc(d.now_plus(-1.5)), utc(d.now_plus(shift))
            ),
            {"shift": 3600.25},
        ).one()
        now, later, earlier, shifted = found
        seconds = [(value - now).total_seconds() for value in (later, earlier, shifted)]
        assert seconds == pytest.approx([90, -1.5, 3600.25], abs=0.002)
        assert abs((now - dt.datetime.now(UTC)).total_seconds()) < 60
        # The statement's time, not the transaction's: it moves within one transaction.
        wait_for(
            lambda: conn.execute(sa.select(utc(d.now()))).scalar_one() > now,
            10,
            "now() to move within one transaction",
        )


# ---- SQL that differs ----------------------------------------------------------------------
@covers("claim_order")
def test_claim_order_is_priority_then_run_at_then_insertion(db: Connected) -> None:
    start = dt.datetime(2030, 1, 1, tzinfo=UTC)
    at = [start + dt.timedelta(seconds=n) for n in range(6)]
    with db.engine.begin() as conn:
        for name, priority, run_at, created_at in [
            ("late", 1, at[2], at[0]),
            ("urgent", 0, at[5], at[1]),
            ("first", 1, at[1], at[2]),
            ("second", 1, at[1], at[3]),
        ]:
            conn.execute(
                sa.insert(db.rows).values(
                    name=name,
                    priority=priority,
                    run_at=sa.literal(run_at, UtcDateTime()),
                    created_at=sa.literal(created_at, UtcDateTime()),
                )
            )
        ordered = conn.execute(
            sa.select(db.rows.c.name).order_by(*db.dialect.claim_order(db.rows))
        ).scalars()
        assert list(ordered) == ["urgent", "first", "second", "late"]


@covers("columnar_insert")
def test_a_columnar_insert_keeps_its_lists_order(db: Connected) -> None:
    stmt = db.dialect.columnar_insert(db.rows, ["name", "priority"])
    if stmt is None:  # none here: SQLAlchemy's multi-row VALUES is used
        return
    with db.engine.begin() as conn:
        conn.execute(stmt, {"name": ["c1", "c2", "c3"], "priority": [3, 2, 1]})
        found = conn.execute(
            sa.select(db.rows.c.name, db.rows.c.priority).order_by(db.rows.c.id)
        ).all()
    assert [tuple(row) for row in found] == [("c1", 3), ("c2", 2), ("c3", 1)]


@covers("in_list", "unindexed")
def test_in_list_and_unindexed_select_what_their_plain_forms_select(db: Connected) -> None:
    add_rows(db, "a", "b", "c")
    name = db.rows.c.name
    with db.engine.connect() as conn:
        listed = conn.execute(
            sa.select(name).where(db.dialect.in_list(name, "names")), {"names": ["a", "c", "z"]}
        )
        assert sorted(listed.scalars()) == ["a", "c"]
        unindexed = conn.execute(sa.select(name).where(db.dialect.unindexed(name) == "b"))
        assert list(unindexed.scalars()) == ["b"]


@covers("consecutive_ids")
def test_consecutive_ids_are_the_ids_a_multi_row_insert_gave(db: Connected) -> None:
    for count in (1, 150):
        with db.engine.connect() as conn, conn.begin():
            ids_of = db.dialect.consecutive_ids(conn, count)
            name = f"ids-{count}"
            inserted = conn.execute(sa.insert(db.rows).values([{"name": name}] * count))
            ids = conn.execute(
                sa.select(db.rows.c.id).where(db.rows.c.name == name).order_by(db.rows.c.id)
            ).scalars()
            if ids_of is not None:  # else they are not known to be consecutive: RETURNING
                assert list(ids_of(inserted.lastrowid, count)) == list(ids)


@covers("returns_inserted_ids")
def test_enqueue_many_returns_the_new_ids_where_the_database_returns_them(
    db: Connected, app: dbqueue.App
) -> None:
    ids = app.enqueue_many(None, [{"task": "t", "queue": QUEUE}] * 3)
    jobs = app.tables.jobs
    with app.engine.connect() as conn:
        rows = conn.execute(sa.select(jobs.c.id).where(jobs.c.queue == QUEUE).order_by(jobs.c.id))
        stored = list(rows.scalars())
    assert len(stored) == 3
    assert ids == (stored if db.dialect.returns_inserted_ids else [])


@covers("insert_sets_times")
def test_enqueue_writes_the_times_itself_only_where_the_defaults_cannot(
    db: Connected, app: dbqueue.App
) -> None:
    inserts: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT"):
            inserts.append(statement)

    sa.event.listen(app.engine, "before_cursor_execute", note)
    try:
        job_id = app.enqueue(None, "t", {}, queue=QUEUE)
    finally:
        sa.event.remove(app.engine, "before_cursor_execute", note)
    [insert] = inserts
    assert ("created_at" in insert) == db.dialect.insert_sets_times
    created = app.get_job(job_id)["created_at"]
    assert abs((created - dt.datetime.now(UTC)).total_seconds()) < 60


@covers("insert_unless_present")
def test_insert_unless_present_inserts_once_and_then_nothing(db: Connected) -> None:
    insert = db.dialect.insert_unless_present(db.counts)
    with db.engine.begin() as conn:
        counts = [
            conn.execute(insert.values(k="once", owner=owner, counter=0)).rowcount
            for owner in (1, 2)
        ]
        owner = conn.execute(sa.select(db.counts.c.owner)).scalar_one()  # still usable
    assert (counts, owner) == ([1, 0], 1)


@covers("insert_or_count", "upsert_rowcount_tells")
def test_insert_or_count_counts_a_second_insert_on_the_row(db: Connected) -> None:
    d, counts = db.dialect, db.counts
    stmt = d.insert_or_count(counts, "counter")
    told = []
    with db.engine.begin() as conn:
        for owner in (1, 2):
            values = stmt.values(k="key", owner=owner, counter=0)
            if d.upsert_rowcount_tells:  # 1 inserted, 2 counted
                told.append(conn.execute(values).rowcount)
            else:  # the row's own columns
                told.append(conn.execute(values.returning(counts.c.owner)).scalar_one())
        row = conn.execute(sa.select(counts.c.owner, counts.c.counter)).one()
    assert told == ([1, 2] if d.upsert_rowcount_tells else [1, 1])
    assert tuple(row) == (1, 1)


@covers("add_to_counter", "counter_returned")
def test_add_to_counter_adds_the_inserted_value_to_the_row(db: Connected) -> None:
    d, counts = db.dialect, db.counts
    stmt = d.add_to_counter(counts, "counter")
    with db.engine.begin() as conn:
        returned = []
        for value in (5, 3):
            values = stmt.values(k="sum", owner=1, counter=value)
            if d.counter_returned:
                returned.append(conn.execute(values.returning(counts.c.counter)).scalar_one())
            else:
                conn.execute(values)
        total = conn.execute(sa.select(counts.c.counter)).scalar_one()
    assert returned == ([5, 8] if d.counter_returned else [])
    assert total == 8


@covers("payload_read", "json_value")
def test_payloads_read_back_and_a_json_value_writes_one_inside_an_expression(
    db: Connected,
) -> None:
    d, rows = db.dialect, db.rows
    doc = {"n": 1, "text": 'é ☃ "quoted"', "list": [1, None, 2.5]}
    other = {"replaced": True}
    with db.engine.begin() as conn:
        row = conn.execute(sa.insert(rows).values(name="doc", payload=doc)).inserted_primary_key[0]
        read = sa.select(d.payload_read(rows.c.payload)).where(rows.c.id == row)
        assert conn.execute(read).scalar_one() == doc
        text = sa.bindparam("doc", type_=sa.Text())
        conn.execute(
            sa.update(rows).values(
                payload=sa.case((rows.c.id == row, d.json_value(text)), else_=rows.c.payload)
            ),
            {"doc": json.dumps(other)},
        )
        assert conn.execute(read).scalar_one() == other


@covers("json_list_append")
def test_json_list_append_stamps_each_entry_and_keeps_the_newest(db: Connected) -> None:
    d, rows = db.dialect, db.rows
    keep = MAX_KEPT_ERRORS
    entry = sa.bindparam("entry", type_=sa.Text())
    append = sa.update(rows).values(payload=d.json_list_append(rows.c.payload, entry, keep))
    with db.engine.begin() as conn:
        row = conn.execute(sa.insert(rows).values(name="errors")).inserted_primary_key[0]
        before = conn.execute(sa.select(utc(d.now()))).scalar_one()
        for n in range(1, keep + 6):
            text = AttemptError(f"line one\nline two ☃ {n}", f"Traceback\n  at {n}").entry(n)
            conn.execute(append.where(rows.c.id == row), {"entry": text})
        listed = conn.execute(sa.select(rows.c.payload).where(rows.c.id == row)).scalar_one()
        after = conn.execute(sa.select(utc(d.now()))).scalar_one()
    assert [e["attempt"] for e in listed] == list(range(6, keep + 6))  # the newest `keep`
    assert listed[0]["message"] == "line one\nline two ☃ 6"
    assert listed[-1]["traceback"] == f"Traceback\n  at {keep + 5}"
    stamps = [dt.datetime.fromisoformat(e["at"].replace("Z", "+00:00")) for e in listed]
    assert all(e["at"].endswith("Z") for e in listed)
    assert stamps == sorted(stamps)
    # The database's UTC clock (SQLite's has milliseconds: its stamps may round down).
    assert before - dt.timedelta(milliseconds=1) <= stamps[0] and stamps[-1] <= after


@covers("database_types", "json_type", "timestamp_type", "server_now_default")
def test_the_column_types_hold_payloads_and_times_and_default_to_the_utc_clock(
    db: Connected,
) -> None:
    cls, sa_dialect = db.cls, db.engine.dialect
    types = cls.database_types()

    def ddl(value: Any) -> str | None:
        return None if value is None else str(value.compile(dialect=sa_dialect))

    assert ddl(types.payload) == ddl(cls.json_type())
    assert ddl(types.timestamp) == ddl(cls.timestamp_type())
    assert str(sa.select(types.server_now).compile(dialect=sa_dialect)) == str(
        sa.select(cls.server_now_default()).compile(dialect=sa_dialect)
    )
    # The fixture's table has these types: a timestamp keeps its microseconds, a row that
    # names no created_at gets the database's UTC clock.
    at = dt.datetime(2031, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
    with db.engine.begin() as conn:
        conn.execute(sa.insert(db.rows).values(name="typed", run_at=sa.literal(at, UtcDateTime())))
        run_at, created_at, now = conn.execute(
            sa.select(utc(db.rows.c.run_at), utc(db.rows.c.created_at), utc(db.dialect.now()))
        ).one()
    assert run_at == at
    assert abs((now - created_at).total_seconds()) < 5


@covers("table_options")
def test_the_table_options_are_those_of_the_created_table(db: Connected) -> None:
    with db.engine.connect() as conn:
        options = db.dialect.table_options(conn, "id")
        reflected = {
            key.replace("_default charset", "_charset"): value
            for key, value in sa.inspect(conn).get_table_options(db.rows.name).items()
        }
    assert {key: str(reflected.get(key)).lower() for key in options} == {
        key: str(value).lower() for key, value in options.items()
    }


# ---- locks and transactions ----------------------------------------------------------------
@covers("supports_skip_locked", "skip_locked_unsupported_reason")
def test_skip_locked_skips_a_row_another_transaction_locked_or_is_refused(db: Connected) -> None:
    d = db.dialect
    if not d.supports_skip_locked:
        reason = re.escape(d.skip_locked_unsupported_reason())
        with pytest.raises(StrategyNotSupportedError, match=reason):
            SkipLockedStrategy(d)
        return
    held, free = add_rows(db, "held", "free")
    both = db.rows.c.id.in_([held, free])
    with db.engine.connect() as holder, db.engine.connect() as other:
        holder.begin()
        holder.execute(sa.select(db.rows.c.id).where(db.rows.c.id == held).with_for_update())
        with other.begin():
            stmt = sa.select(db.rows.c.id).where(both).with_for_update(skip_locked=True)
            assert list(other.execute(stmt).scalars()) == [free]
        holder.rollback()


def _taken(conn: sa.Connection, expression: Any) -> bool:
    with conn.begin():
        return bool(conn.execute(sa.select(expression)).scalar())


@covers(
    "supports_named_locks",
    "try_lock",
    "unlock",
    "try_lock_named_by",
    "unlock_named_by",
    "named_locks_unsupported_reason",
)
def test_named_locks_belong_to_one_connection_or_are_refused(db: Connected) -> None:
    d = db.dialect
    prefix = f"{db.backend.prefix}conf:job:"
    name = f"{db.backend.prefix}conf:lock"
    if not d.supports_named_locks:
        reason = re.escape(d.named_locks_unsupported_reason())
        with pytest.raises(StrategyNotSupportedError, match=reason):
            d.try_lock(name)
        with pytest.raises(StrategyNotSupportedError, match=reason):
            d.unlock(name)
        assert d.try_lock_named_by(prefix) is None and d.unlock_named_by(prefix) is None
        with pytest.raises(StrategyNotSupportedError, match=reason):
            AdvisoryLockStrategy(d)
        return
    with db.engine.connect() as a, db.engine.connect() as b:
        assert _taken(a, d.try_lock(name)) and not _taken(b, d.try_lock(name))
        assert _taken(a, d.unlock(name)) and _taken(b, d.try_lock(name))
        assert _taken(b, d.unlock(name))
        lock = d.try_lock_named_by(prefix)
        if lock is None:  # the name cannot be built in SQL here: read, then lock by name
            assert d.unlock_named_by(prefix) is None
            return
        # A key's lock named in SQL is the lock its name takes.
        assert _taken(a, d.try_lock(f"{prefix}42"))
        with b.begin():
            taken = b.execute(sa.select(lock(sa.literal(42)), lock(sa.literal(43)))).one()
        assert [bool(t) for t in taken] == [False, True]
        assert _taken(a, d.unlock(f"{prefix}42"))
        unlock = d.unlock_named_by(prefix)
        if unlock is None:
            assert _taken(b, d.unlock(f"{prefix}43"))
        else:
            with b.begin():
                b.execute(unlock, {"keys": [43]})
        assert _taken(a, d.try_lock(f"{prefix}43")) and _taken(a, d.unlock(f"{prefix}43"))


@covers("writes_in_with")
def test_a_with_clause_holds_an_update_only_where_the_dialect_says_so(db: Connected) -> None:
    [row] = add_rows(db, "cte")
    rows = db.rows
    written = (
        sa.update(rows).where(rows.c.id == row).values(priority=7).returning(rows.c.id).cte("w")
    )
    with db.engine.connect() as conn:
        if db.dialect.writes_in_with:
            with conn.begin():
                assert list(conn.execute(sa.select(written.c.id)).scalars()) == [row]
            assert conn.execute(sa.select(rows.c.priority)).scalar_one() == 7
        else:
            with pytest.raises((sa.exc.DBAPIError, sa.exc.CompileError)), conn.begin():
                conn.execute(sa.select(written.c.id))


@covers("supports_savepoints")
def test_savepoints_roll_back_alone_or_a_worker_runs_one_job_per_transaction(
    db: Connected, app: dbqueue.App
) -> None:
    if db.dialect.supports_savepoints:
        with db.engine.connect() as conn, conn.begin():
            conn.execute(sa.insert(db.rows).values(name="outer"))
            inner = conn.begin_nested()
            conn.execute(sa.insert(db.rows).values(name="inner"))
            inner.rollback()
        assert db.committed() == ["outer"]
    worker = app.worker(
        strategy=db.backend.strategy,
        queues=[QUEUE],
        batch_size=10,
        burst=True,
        maintenance=False,
        install_signal_handlers=False,
    )
    worker.run()
    assert worker.batch_size == (10 if db.dialect.supports_savepoints else 1)


@covers("single_writer", "take_write_lock", "is_transient")
def test_writers_wait_for_one_another_as_the_database_admits_them(db: Connected) -> None:
    """A transaction that took the write lock (having written nothing) keeps every other
    writer out where the database admits one writer at a time; elsewhere only its rows' writers.
    Either way the other writer's failure is transient (retry the transaction)."""
    d = db.dialect
    [mine] = add_rows(db, "mine")
    with db.engine.connect() as holder, db.impatient() as impatient:
        holder.begin()
        holder.execute(sa.select(db.rows.c.id)).all()  # a read first, as a claim does
        d.take_write_lock(holder, db.rows)
        with impatient.connect() as other:
            elsewhere = sa.insert(db.rows).values(name="elsewhere")
            if d.single_writer:
                with pytest.raises(sa.exc.DBAPIError) as locked:
                    other.execute(elsewhere)
                assert d.is_transient(locked.value)
                other.rollback()
            else:
                other.execute(elsewhere)
                other.commit()
            holder.execute(sa.update(db.rows).where(db.rows.c.id == mine).values(priority=1))
            with pytest.raises(sa.exc.DBAPIError) as waited:
                other.execute(sa.update(db.rows).where(db.rows.c.id == mine).values(priority=2))
            assert d.is_transient(waited.value) and not d.is_missing_table(waited.value)
            other.rollback()
        holder.rollback()


@covers("is_missing_table")
def test_a_missing_table_is_told_from_other_errors(db: Connected) -> None:
    missing = sa.table(f"{db.backend.prefix}conf_missing", sa.column("id"))
    with db.engine.connect() as conn, pytest.raises(sa.exc.DBAPIError) as raised:
        conn.execute(sa.select(missing.c.id))
    assert db.dialect.is_missing_table(raised.value)
    assert not db.dialect.is_transient(raised.value)


@covers("one_statement_transaction")
def test_one_statement_transaction_commits_its_statement_and_leaves_the_connection_as_it_was(
    db: Connected,
) -> None:
    with db.engine.connect() as conn:
        with db.dialect.one_statement_transaction(conn):
            conn.execute(sa.insert(db.rows).values(name="alone"))
            seen_inside = db.committed()
        assert db.committed() == ["alone"]
        # Committed as it ran only where the driver can (the dialect says so by overriding).
        assert ("alone" in seen_inside) == db.backend.one_statement_commits_alone
        with conn.begin() as transaction:
            conn.execute(sa.insert(db.rows).values(name="undone"))
            transaction.rollback()
    assert db.committed() == ["alone"]


@covers("statements_alone")
def test_statements_alone_commit_alone_only_in_a_transaction_that_sent_nothing(
    db: Connected,
) -> None:
    with db.engine.connect() as conn:
        with conn.begin(), db.dialect.statements_alone(conn):
            conn.execute(sa.insert(db.rows).values(name="alone"))
            seen_inside = db.committed()
        assert db.committed() == ["alone"]
        assert ("alone" in seen_inside) == db.backend.statements_commit_alone
        with conn.begin() as transaction:
            conn.execute(sa.insert(db.rows).values(name="first"))
            with db.dialect.statements_alone(conn):
                conn.execute(sa.insert(db.rows).values(name="second"))
                seen_inside = db.committed()
            transaction.rollback()
    assert seen_inside == ["alone"] and db.committed() == ["alone"]


@covers("commit_unflushed")
def test_commit_unflushed_is_read_inside_a_transaction_that_then_commits(db: Connected) -> None:
    unflushed = db.dialect.commit_unflushed()
    if unflushed is None:  # no per-transaction setting here: commits flush as usual
        return
    with db.engine.connect() as conn:
        with conn.begin():
            conn.execute(sa.select(unflushed))
            conn.execute(sa.insert(db.rows).values(name="unflushed"))
        assert db.committed() == ["unflushed"]
        with conn.begin():  # transaction-local: the next transaction may read it again
            conn.execute(sa.select(unflushed))


@covers("side_database_url")
def test_the_side_database_takes_writes_while_the_queue_database_is_write_locked(
    db: Connected,
) -> None:
    url = sa.engine.make_url(db.backend.url)
    side = db.cls.side_database_url(url)
    if side is None:  # cancel requests live beside the jobs
        return
    assert side.database != url.database
    scratch = sa.Table(f"{db.backend.prefix}conf_side", sa.MetaData(), sa.Column("n", sa.Integer))
    side_engine = dialects.create_engine(side)
    try:
        with db.engine.connect() as holder:
            holder.begin()
            db.dialect.take_write_lock(holder, db.rows)
            with side_engine.begin() as conn:
                scratch.create(conn, checkfirst=True)
                conn.execute(scratch.insert().values(n=1))
            holder.rollback()
        with side_engine.begin() as conn:
            assert conn.execute(sa.select(scratch.c.n)).scalars().all() == [1]
            scratch.drop(conn)
    finally:
        side_engine.dispose()


# ---- push wake-ups -------------------------------------------------------------------------
@covers("notifier", "supports_listen_notify")
def test_an_insert_from_any_connection_wakes_the_notifier_where_it_can(
    db: Connected, app: dbqueue.App
) -> None:
    notifier = db.dialect.notifier(db.engine, app.names.qualified_jobs)
    if isinstance(notifier, PollingOnly):  # workers poll
        assert not notifier.pushes and not db.dialect.supports_listen_notify
        return
    assert notifier.pushes == db.dialect.supports_listen_notify  # LISTEN: the poll may be long
    woken = threading.Event()
    notifier.start(woken.set, [QUEUE])
    try:
        assert woken.wait(30), "the notifier never connected"  # it wakes once connected
        woken.clear()
        with db.engine.begin() as conn:  # plain SQL: an insert trigger, or the commit, tells
            conn.execute(sa.insert(app.tables.jobs).values(task="wake", queue=QUEUE))
        assert woken.wait(30), "the insert woke nobody"
    finally:
        notifier.stop()


@covers("announcement", "finish_listener", "finishes_pushed")
def test_a_finish_is_pushed_to_its_listener_where_the_database_pushes(
    db: Connected, app: dbqueue.App
) -> None:
    d, channel = db.dialect, app.names.qualified_jobs
    announce = d.announcement()
    assert (announce is not None) == d.supports_listen_notify
    heard: list[list[int] | None] = []
    listener = d.finish_listener(db.engine, channel, heard.append)
    if not d.finishes_pushed:  # app.call polls
        assert listener is None and announce is None
        return
    assert listener is not None
    listener.start()
    try:
        wait_for(lambda: heard, 30, "the listener to connect")  # told to look once connected
        assert heard == [None]
        with db.engine.begin() as conn:
            if announce is not None:
                for message in (QUEUE, results.finished_notice([7, 8])):
                    conn.execute(announce, {"channel": channel, "message": message})
            else:  # any commit may have finished a job: look again
                conn.execute(sa.insert(db.rows).values(name="finished"))
        wait_for(lambda: len(heard) > 1, 30, "the finish to be pushed")
        assert heard == [None, [7, 8] if announce is not None else None]
    finally:
        listener.stop()


# ---- migrations ----------------------------------------------------------------------------
@covers("needs_batch_alter", "version_table_pk")
def test_alembic_alters_tables_as_the_dialect_says(db: Connected, app: dbqueue.App) -> None:
    with db.engine.connect() as conn:
        pk = sa.inspect(conn).get_pk_constraint(app.names.version_table)["constrained_columns"]
    assert bool(pk) == db.dialect.version_table_pk
    table = db.rows.name
    with db.engine.begin() as conn:
        operations = Operations(MigrationContext.configure(conn))
        if db.dialect.needs_batch_alter:  # ALTER TABLE cannot: Alembic rebuilds the table
            with pytest.raises(NotImplementedError):
                operations.create_unique_constraint("conf_uq", table, ["name"])
        else:
            operations.create_unique_constraint("conf_uq", table, ["name"])
            operations.drop_constraint("conf_uq", table, type_="unique")
        with operations.batch_alter_table(table) as batch:
            batch.create_unique_constraint("conf_uq", ["name"])
        with operations.batch_alter_table(table) as batch:
            batch.drop_constraint("conf_uq", type_="unique")

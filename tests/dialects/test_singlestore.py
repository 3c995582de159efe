"""SingleStore: the DDL and SQL dbqueue emits, checked against SingleStore's documented limits.

No SingleStore server exists here. Two kinds of checks stand in for one:

- compile-only: the migrations' DDL as SingleStore would receive it (Alembic's offline mode
  with the singlestoredb dialect, which assumes a real SingleStore), and the statements the
  engine builds, compiled by the singlestoredb dialect;
- an audit of every statement a real run sends through the singlestoredb driver — enqueue,
  claims, successes, failures, dead letters, rescue, purge, stats — against MariaDB.

The limits (docs.singlestore.com, "Distributed SQL Surface Area", CREATE TABLE, UPDATE, and
django-singlestore's features.py): no SKIP LOCKED or NOWAIT, no named locks, no savepoints, no
triggers or foreign keys, unique keys must contain the shard key, no UPDATE … LIMIT and no update
of the shard key on sharded tables, AUTO_INCREMENT must be BIGINT and is not monotonic; and
``x :> T`` (what this dialect makes of CAST to FLOAT) parses on SingleStore only.
"""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
import sqlalchemy_singlestoredb
from sqlalchemy.dialects import mysql

import dbqueue
from dbqueue import strategies
from dbqueue.dialects.singlestore import SingleStoreDialect
from dbqueue.engine import NewJob, QueueEngine
from dbqueue.job import Job
from dbqueue.migrations import migrate
from dbqueue.schema.tables import TableNames, tables_for

NAMES = TableNames.resolve("ss_")
FORBIDDEN = {
    "SKIP LOCKED": r"\bSKIP\s+LOCKED\b",
    "NOWAIT": r"\bNOWAIT\b",
    "SAVEPOINT": r"\bSAVEPOINT\b",
    "GET_LOCK": r"\b(GET_LOCK|RELEASE_LOCK|IS_USED_LOCK)\b",
    "the :> cast": r":>",
    "a trigger": r"\bTRIGGER\b",
    "a foreign key": r"\b(FOREIGN\s+KEY|REFERENCES)\b",
}


def violations(statement: str) -> list[str]:
    text = statement.upper()
    found = [what for what, pattern in FORBIDDEN.items() if re.search(pattern, text)]
    if re.match(r"\s*UPDATE\b", text) and re.search(r"\bLIMIT\b", text):
        found.append("UPDATE … LIMIT")
    return found


def singlestore() -> SingleStoreDialect:
    """The dialect as connected to a real SingleStore 8.5 (flavour known, no connection)."""
    sa_dialect = sqlalchemy_singlestoredb.dialect()
    sa_dialect.server_version_info = (5, 7, 32)
    sa_dialect.__dict__["_dbqueue_singlestore_version"] = (8, 5, 4)
    return SingleStoreDialect(sa_dialect)


def compiled(stmt: sa.ClauseElement, dialect: SingleStoreDialect) -> str:
    return str(stmt.compile(dialect=dialect.sa_dialect))


# ---- DDL ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ddl() -> str:
    return migrate.upgrade_sql("singlestoredb://user@singlestore.invalid:3306/db", NAMES)


def create_tables(ddl: str) -> dict[str, str]:
    return {
        name: body
        for name, body in re.findall(r"CREATE (?:ROWSTORE )?TABLE (\w+) \((.*?)\n\)", ddl, re.S)
    }


def test_queue_tables_are_sharded_rowstores_keyed_on_their_primary_key(ddl):
    assert f"CREATE ROWSTORE TABLE {NAMES.jobs} (" in ddl
    assert f"CREATE ROWSTORE TABLE {NAMES.maintenance} (" in ddl
    tables = create_tables(ddl)
    for table, key in ((NAMES.jobs, "id"), (NAMES.maintenance, "routine")):
        body = tables[table]
        assert f"PRIMARY KEY ({key})" in body and f"SHARD KEY ({key})" in body
        assert "REFERENCE" not in body  # reference tables replicate asynchronously


def test_every_unique_key_contains_the_shard_key(ddl):
    for table, body in create_tables(ddl).items():
        shard = re.search(r"SHARD KEY \(([^)]*)\)", body)
        shard_columns = set(shard.group(1).split(", ")) if shard else set()
        for kind, columns in re.findall(r"(PRIMARY KEY|UNIQUE(?: KEY)?) \(([^)]*)\)", body):
            assert shard_columns <= set(columns.split(", ")), (table, kind, columns)
    assert "CREATE UNIQUE INDEX" not in ddl


def test_no_triggers_no_foreign_keys_no_casts_singlestore_would_reject(ddl):
    for statement in ddl.split(";"):
        assert violations(statement) == [], statement


def test_ids_are_bigint_auto_increment_and_times_default_to_the_clock(ddl):
    body = create_tables(ddl)[NAMES.jobs]
    assert "id BIGINT NOT NULL AUTO_INCREMENT" in body
    # A DEFAULT must be a plain time function on SingleStore; dbqueue's own inserts write
    # UTC_TIMESTAMP(6) (see the audit below).
    assert "run_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)" in body
    assert "payload LONGTEXT" in body


def test_the_migration_version_table_has_no_key_to_update(ddl):
    # Alembic UPDATEs version_num from one revision to the next: as a primary key it would be
    # the shard key, which a sharded table does not let an UPDATE change.
    version = create_tables(ddl)[NAMES.version_table]
    assert "PRIMARY KEY" not in version and "UNIQUE" not in version
    assert f"UPDATE {NAMES.version_table} SET version_num='0002'" in ddl


def test_a_stand_in_server_gets_plain_create_table():
    sa_dialect = sqlalchemy_singlestoredb.dialect()
    sa_dialect.__dict__["_dbqueue_singlestore_version"] = ()  # MariaDB behind the driver
    assert SingleStoreDialect(sa_dialect).table_options(None, "id") == {}
    assert set(singlestore().table_options(None, "id")) == {
        "singlestoredb_table_type",
        "singlestoredb_shard_key",
    }


# ---- statements ---------------------------------------------------------------------------------
def test_the_claim_reads_in_priority_run_at_created_order_without_locking_clauses():
    dialect = singlestore()
    engine = QueueEngine(tables_for(NAMES), dialect)
    sql = compiled(engine.claims.runnable("default", 10), dialect)
    order = re.search(r"ORDER BY (.*?) LIMIT", sql, re.S).group(1)
    assert [c.strip() for c in order.split(",")] == [
        f"{NAMES.jobs}.priority",
        f"{NAMES.jobs}.run_at",
        f"{NAMES.jobs}.created_at",
    ]  # never by id: AUTO_INCREMENT is not monotonic across aggregators
    assert "FOR UPDATE" not in sql and violations(sql) == []
    assert "UTC_TIMESTAMP(6)" in sql.upper()


def test_now_plus_never_casts_to_float():
    dialect = singlestore()
    for seconds in (30.5, sa.bindparam("delay_seconds", type_=sa.Float())):
        sql = compiled(sa.select(dialect.now_plus(seconds)), dialect).upper()
        assert "DATE_ADD(UTC_TIMESTAMP(6), INTERVAL CAST(" in sql
        assert "AS SIGNED INTEGER) MICROSECOND)" in sql
        assert violations(sql) == []
    # What the base implementation would have sent, and why it is not used here:
    assert ":>" in compiled(sa.select(sa.cast(sa.literal(1.5), sa.Float())), dialect)


def test_the_claim_update_is_a_compare_and_set_without_limit():
    dialect = singlestore()
    jobs = tables_for(NAMES).jobs
    stmt = (
        sa.update(jobs)
        .where(jobs.c.id.in_([1, 2]), jobs.c.status == "available")
        .values(status="running")
    )
    sql = compiled(stmt, dialect)
    assert "WHERE ss_jobs.id IN (" in sql and "ss_jobs.status = " in sql
    assert violations(sql) == []


def test_capabilities_choose_the_lock_server():
    dialect = singlestore()
    assert dialect.default_strategy == "lock_server"
    assert not dialect.supports_savepoints and not dialect.returns_inserted_ids
    with pytest.raises(dbqueue.StrategyNotSupportedError, match="no SELECT ... FOR UPDATE SKIP"):
        strategies.create("skip_locked", dialect)
    with pytest.raises(dbqueue.StrategyNotSupportedError, match="no named locks"):
        strategies.create("advisory_lock", dialect)
    # sqlalchemy-singlestoredb inherits MySQL's compiler and would print SKIP LOCKED anyway:
    select = sa.select(sa.literal(1)).with_for_update(skip_locked=True)
    assert "SKIP LOCKED" in compiled(select, dialect)


def test_urls_get_autocommit_off_and_refuse_it_on():
    url = SingleStoreDialect.normalize_url(sa.engine.make_url("singlestoredb://u@h/db"))
    assert url.query["autocommit"] == "false"
    with pytest.raises(dbqueue.ConfigurationError, match="autocommit"):
        SingleStoreDialect.normalize_url(sa.engine.make_url("singlestoredb://u@h/db?autocommit=1"))
    assert SingleStoreDialect.json_type().compile(dialect=mysql.dialect()) == "LONGTEXT"


# ---- the statements a real run sends (against MariaDB through the singlestoredb driver) -------
@pytest.mark.parametrize("backend", ["singlestore-lock_server"], indirect=True)
def test_every_statement_of_a_real_run_respects_the_limits(backend):
    sent: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        if conn.engine.url.get_backend_name() == "singlestoredb":
            sent.append(statement)

    app = backend.app(max_attempts=2)

    @app.task("ok")
    def ok(job, session):
        session.execute(sa.text("SELECT 1"))

    @app.task("fails")
    def fails(job, session):
        raise RuntimeError("always")

    @app.dead_handler("fails")
    def buried(job, session):
        return "buried"

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", record)
    try:
        app.enqueue_many(None, [{"task": "ok", "payload": i} for i in range(5)])
        app.enqueue_many(None, [{"task": "ok", "delay": 0.01}, {"task": "fails"}])
        app.enqueue(None, "ok", {"later": True}, delay=0.01)
        worker = app.worker(
            strategy="lock_server", burst=True, batch_size=10, install_signal_handlers=False
        )
        while True:  # retries come due after the backoff: run until nothing is left
            summary = worker.run()
            if not [s for s in app.stats() if s.counts.get("available")]:
                break
            worker = app.worker(strategy="lock_server", burst=True, install_signal_handlers=False)
        for routine in ("rescue", "purge", "renotify"):
            app.run_maintenance(routine, strategy="lock_server")
        app.stats()
        dead = app.dead_jobs()
        app.requeue_dead([d["id"] for d in dead])
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", record)
    assert worker.batch_size == 1 and summary is not None  # no savepoints: a job per transaction
    statuses = sorted(j["status"] for j in backend.jobs())
    assert statuses == ["available"] + ["succeeded"] * 8  # the requeued dead job waits again
    assert len(sent) > 50
    bad = {s: violations(s) for s in sent if violations(s)}
    assert bad == {}
    insert_jobs = f"INSERT INTO {backend.prefix}jobs ".upper()
    inserts = [s for s in sent if s.lstrip().upper().startswith(insert_jobs)]
    assert inserts and all("RETURNING" not in s.upper() for s in inserts)
    assert all("UTC_TIMESTAMP(6)" in s.upper() for s in inserts)  # not the zone's DEFAULT
    claims = [s for s in sent if re.search(r"ORDER BY .*priority", s)]
    assert claims and all("created_at" in s and ".id LIMIT" not in s for s in claims)


def test_new_jobs_carry_no_id_order():
    # The claim's tie-breaker is created_at; NewJob never sets it (the insert writes now()).
    assert "created_at" not in NewJob("t", None, "q", 1, 1).values()
    assert "created_at" in Job.__slots__

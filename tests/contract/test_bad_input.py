"""Bad input on every database: rows written by hand, unsafe names, wrong credentials, old schemas.

Each wrong input gets either a refusal (by the database or by dbqueue, before any SQL) or a clear
message naming the problem and the fix, and nothing else is lost or stuck.
"""

from __future__ import annotations

import secrets

import pytest
import sqlalchemy as sa
from support.backends import PREFIX, drop_queue_tables

import dbqueue
from dbqueue.migrations import migrate

# (what, columns a plain SQL INSERT sets besides task and payload). Values are bound
# parameters, as any client would send them.
HAND_WRITTEN = {
    "null task": {"task": None},
    "null run_at": {"run_at": None},
    "empty task": {"task": ""},
    "invalid JSON payload": {"payload": "{oops"},
    "unknown status": {"status": "bogus"},
    "text run_at": {"run_at": "2000-01-01 not a time"},
    "text created_at": {"created_at": "garbage"},
    "text priority": {"priority": "high"},
    "text attempt": {"attempt": "x"},
    "text max_attempts": {"max_attempts": "y"},
}


def insert_by_hand(engine: sa.Engine, table: str, columns: dict) -> int | None:
    """INSERT with plain SQL; the new id, or None when the database refused the row."""
    values = {"task": "ok", "payload": '{"by": "hand"}', **columns}
    names = ", ".join(values)
    params = ", ".join(f":{name}" for name in values)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"INSERT INTO {table} ({names}) VALUES ({params})"), values)
            return conn.execute(sa.text(f"SELECT max(id) FROM {table}")).scalar()
    except sa.exc.DBAPIError:
        return None


def test_rows_written_by_hand_are_refused_or_handled_and_never_stop_the_worker(database):
    app = database.app(retry_base_interval=3600)  # a failed attempt is not retried in this run
    ran = []

    @app.task("ok")
    def ok(job, session):
        ran.append(job.id)

    engine = app.create_engine()
    try:
        ids = {
            what: insert_by_hand(engine, app.names.jobs, cols)
            for what, cols in HAND_WRITTEN.items()
        }
        good = [insert_by_hand(engine, app.names.jobs, {}) for _ in range(3)]
    finally:
        engine.dispose()
    # NOT NULL columns: every database refuses these.
    assert ids["null task"] is None and ids["null run_at"] is None
    # Typed columns: PostgreSQL and MariaDB refuse what SQLite stores as text. The JSON type
    # checks payloads on PostgreSQL and MariaDB; the SingleStore path keeps LONGTEXT (SQLite text).
    typed = database.typed_columns
    json_checked = database.checks_json
    for what in list(HAND_WRITTEN)[3:]:
        if what == "unknown status":
            continue
        refused = json_checked if what == "invalid JSON payload" else typed
        assert (ids[what] is None) == refused, what

    summary = database.run_worker(app)  # returns: no row stopped it
    assert summary.processed >= 3
    jobs = {j["id"]: j for j in database.jobs()}
    assert all(jobs[i]["status"] == "succeeded" for i in good)
    assert not [j for j in jobs.values() if j["status"] == "running"]

    empty = jobs[ids["empty task"]]
    assert empty["status"] == "available" and empty["attempt"] == 1  # retried by the usual rules
    assert "unknown task ''" in empty["message"] and "@app.task(''" in empty["message"]
    bogus = jobs[ids["unknown status"]]
    assert (bogus["status"], bogus["attempt"]) == ("bogus", 0)  # not claimable: left alone
    if not typed:
        bad_json = jobs[ids["invalid JSON payload"]]
        assert "stored payload is not valid JSON" in bad_json["message"]
        assert "fix its payload column and requeue it" in bad_json["message"]
        for what in ("text attempt", "text max_attempts"):
            row = jobs[ids[what]]
            assert row["status"] == "dead", what
            assert "cannot be read" in row["message"] and "requeue it" in row["message"]
        # A text timestamp reads as None instead of failing the claim.
        assert jobs[ids["text created_at"]]["status"] == "succeeded"
        assert ids["text run_at"] in ran
        assert jobs[ids["text priority"]]["status"] == "succeeded"


@pytest.mark.parametrize(
    "options",
    [
        {"table_prefix": "jobs; DROP TABLE x; --"},
        {"table_prefix": "a-b_"},
        {"schema": "public; DROP"},
        {"schema": 'sch"ema'},
        {"jobs_table": "jobs where 1=1"},
        {"subscriptions_table": "subs`"},
        {"queue": "default'; --"},
        {"table_prefix": "x" * 41},
    ],
)
def test_unsafe_names_are_refused_before_any_sql(database, options):
    statements = []

    def record(conn, cursor, statement, *args):
        statements.append(statement)

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", record)
    try:
        with pytest.raises(dbqueue.UnsafeIdentifierError) as refused:
            dbqueue.App(database.url, **options)
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", record)
    assert statements == []
    message = str(refused.value)
    assert repr(next(iter(options.values()))) in message  # names the bad value
    assert "e.g." in message  # and shows a good one


@pytest.mark.parametrize(
    "variable, value",
    [
        ("DBQUEUE_TABLE_PREFIX", "p; drop"),
        ("DBQUEUE_SCHEMA", "s.t"),
        ("QUEUE_TABLE", "jobs(1)"),
        ("QUEUE_SUBSCRIBER_TABLE", "subs'"),
        ("QUEUE_NAME", "q name"),
    ],
)
def test_unsafe_names_from_the_environment_are_refused(database, variable, value):
    with pytest.raises(dbqueue.UnsafeIdentifierError, match="not"):
        dbqueue.App(database.url, environ={variable: value})


def test_unsafe_queue_names_are_refused_at_every_other_entry_point(database):
    app = database.app()
    bad = "q'; DELETE FROM jobs; --"
    with pytest.raises(dbqueue.UnsafeIdentifierError):
        app.task("t", queue=bad)(lambda job, session: None)
    with pytest.raises(dbqueue.UnsafeIdentifierError):
        app.enqueue(None, "t", queue=bad)
    with pytest.raises(dbqueue.UnsafeIdentifierError):
        app.enqueue_many(None, [{"task": "t"}, {"task": "t", "queue": bad}])
    with pytest.raises(dbqueue.UnsafeIdentifierError):
        app.worker(queues=["default", bad])
    with pytest.raises(dbqueue.UnsafeIdentifierError):
        dbqueue.schema.TableNames("jobs; drop", "subs")  # even built directly
    assert database.jobs() == []


def test_wrong_credentials_are_one_clear_error_without_the_password(database):
    url = sa.engine.make_url(database.url)
    if not database.has_server:  # no credentials: a database that cannot be opened
        wrong = f"sqlite:///{url.database}.missing-dir/x.db"
    else:
        wrong = url.set(username="dbqueue_nobody", password="s3cret-pw").render_as_string(False)
    app = dbqueue.App(wrong, table_prefix=PREFIX)
    with pytest.raises(dbqueue.DatabaseUnavailableError) as refused:
        app.run_worker(burst=True, install_signal_handlers=False)
    message = str(refused.value)
    assert "cannot connect to" in message and "credentials" in message, message
    assert "s3cret-pw" not in message
    assert len(message.splitlines()) == 1


def test_an_unreachable_server_is_one_clear_error(database):
    if not database.has_server:  # no port of its own: another database's, where none listens
        url = "postgresql+psycopg2://postgres@127.0.0.1:1/test"
    else:
        url = sa.engine.make_url(database.url).set(port=1).render_as_string(False)
    with pytest.raises(dbqueue.DatabaseUnavailableError, match="that the server is running"):
        dbqueue.App(url).run_worker(burst=True, install_signal_handlers=False)


def test_a_schema_at_an_older_migration_says_to_run_dbqueue_migrate(database):
    prefix = f"old_{secrets.token_hex(3)}_"
    # SingleStore claims through the lock server, which a worker must reach at start-up.
    app = dbqueue.App(database.url, table_prefix=prefix, lock_server=database.server)
    engine = app.create_engine()
    try:
        migrate.upgrade(engine, app.names, "0001")
        with pytest.raises(dbqueue.SchemaMissingError) as outdated:
            app.run_worker(burst=True, install_signal_handlers=False)
        message = str(outdated.value)
        assert "at migration 0001" in message and "run `dbqueue migrate`" in message, message
        migrate.upgrade(engine, app.names)  # the fix it names works
        assert app.run_worker(burst=True, install_signal_handlers=False).processed == 0
    finally:
        drop_queue_tables(engine, prefix)
        engine.dispose()
        app.engine.dispose()


def test_the_payload_size_limit_comes_from_the_environment_too(database):
    app = database.app(environ={"DBQUEUE_MAX_PAYLOAD_BYTES": "64"})
    with pytest.raises(dbqueue.PayloadError, match="over the limit of 64 bytes") as refused:
        app.enqueue(None, "t", {"blob": "x" * 100})
    assert "max_payload_bytes" in str(refused.value)  # names the fix
    app.enqueue(None, "t", {"small": 1})
    assert len(database.jobs()) == 1

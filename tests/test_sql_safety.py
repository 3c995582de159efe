"""SQL injection cannot happen: values are always bound parameters, identifiers always validated.

Two proofs. (1) Static: every place in dbqueue/ that writes SQL as text (``text()``,
``literal_column()``, a string handed to ``execute``) is listed below with the reason it is
safe; a new one fails this test until someone reviews it and adds it here. (2) Dynamic: a whole
workload (enqueue, claim with each strategy, fail, dead-letter, requeue, stats, maintenance) runs
on every backend with marker strings in every value a user controls, and no SQL statement sent
to the database contains one: they all travelled as parameters.
"""

from __future__ import annotations

import re
from pathlib import Path

import sqlalchemy as sa

PACKAGE = Path(__file__).resolve().parents[1] / "dbqueue"
RAW_SQL = re.compile(
    r"\btext\(|literal_column\(|exec_driver_sql\(|op\.execute\(|\.execute\(\s*f?[\"']"
)

# (file, fragment of the line) → why it is safe.
REVIEWED = {
    ("dialects/pg_listen.py", 'cursor.execute(f"LISTEN {quoted}")'): (
        "no Core construct for LISTEN; the channel is the validated table name, quoted by "
        "the dialect's identifier preparer"
    ),
    ("dialects/mysql.py", 'sa.literal_column("6")'): "constant: UTC_TIMESTAMP precision",
    ("dialects/mysql.py", 'sa.literal_column("MICROSECOND")'): "constant: a unit keyword",
    ("dialects/mysql.py", 'sa.literal_column("0")'): "constant: GET_LOCK's timeout",
    ("dialects/mysql.py", "sa.func.concat(column, sa.literal_column(\"''\"))"): (
        "constant: an empty string"
    ),
    ("dialects/mysql.py", 'sa.text("KILL CONNECTION :id")'): "no Core construct; id is bound",
    ("dialects/mysql.py", 'sa.literal_column("@@innodb_autoinc_lock_mode"),'): (
        "constant: no Core construct for a system variable"
    ),
    ("dialects/mysql.py", 'sa.literal_column("@@auto_increment_increment"),'): (
        "constant: no Core construct for a system variable"
    ),
    ("dialects/mysql.py", 'sa.text("(UTC_TIMESTAMP(6))")'): "constant DDL default",
    ("dialects/sqlite.py", "sa.literal_column(\"''\")"): "constant: an empty string",
    ("dialects/postgresql.py", 'return column.op("||")(sa.literal_column("\'\'"))'): (
        "constant: an empty string"
    ),
    ("dialects/sqlite.py", "sa.text(f\"(strftime('{_CLOCK_FORMAT}', 'now'))\")"): (
        "constant DDL default (module constant)"
    ),
    ("dialects/sqlite.py", 'cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")'): (
        "PRAGMA takes no parameters; the value is an int constant"
    ),
    ("dialects/sqlite.py", 'cursor.execute("PRAGMA journal_mode = WAL")'): "constant",
    ("dialects/sqlite_watch.py", 'conn.execute("PRAGMA data_version")'): (
        "constant, on the watch's own sqlite3 connection (no SQLAlchemy: a few microseconds)"
    ),
    ("dialects/singlestore.py", 'cursor.execute("SELECT @@memsql_version")'): (
        "constant: no Core construct for a system variable"
    ),
    ("dialects/singlestore.py", 'sa.literal_column("6")'): "constant: UTC_TIMESTAMP precision",
    ("dialects/singlestore.py", 'sa.text("CURRENT_TIMESTAMP(6)")'): "constant DDL default",
    ("dialects/singlestore.py", 'cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL'): (
        "constant"
    ),
    ("engine/compiled.py", "return _ResultCursor(conn.exec_driver_sql(sql, parameters))"): (
        "the SQL is a Core statement compiled by the connection's dialect; values are bound"
    ),
    ("migrations/versions/0001_jobs_table.py", 'sa.text("finished_at IS NOT NULL")'): (
        "constant partial-index predicate"
    ),
    ("migrations/versions/0002_maintenance_and_notify.py", "op.execute("): (
        "trigger DDL: names come from TableNames (validated in __post_init__) and are quoted "
        "by the dialect's identifier preparer; no values"
    ),
}

MARK = "zq7mark"
TENANT = 918273645


def raw_sql_sites() -> list[tuple[str, str]]:
    sites = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line in path.read_text().splitlines():
            if RAW_SQL.search(line) and not line.lstrip().startswith("#"):
                sites.append((path.relative_to(PACKAGE).as_posix(), line.strip()))
    return sites


def test_every_raw_sql_site_in_the_package_has_been_reviewed():
    sites = raw_sql_sites()
    unreviewed = [
        (file, line)
        for file, line in sites
        if not any(file == f and fragment in line for f, fragment in REVIEWED)
    ]
    assert unreviewed == [], f"raw SQL to review (then list it in REVIEWED): {unreviewed}"
    stale = [
        key
        for key in REVIEWED
        if not any(file == key[0] and key[1] in line for file, line in sites)
    ]
    assert stale == [], f"REVIEWED lists sites that no longer exist: {stale}"


def test_no_user_value_is_ever_part_of_the_sql_text(backend):
    statements: list[str] = []

    def record(conn, cursor, statement, *args):
        statements.append(statement)

    app = backend.app()
    task, queue = f"task_{MARK}", f"queue_{MARK}"

    @app.task(task, queue=queue, max_attempts=1, dead_handler=lambda job, s: f"dead_{MARK}")
    def handler(job, session):
        if job.payload["fail"]:
            raise ValueError(f"error_{MARK}")
        return f"done_{MARK}"

    columns = dict(
        external_key=f"key_{MARK}",
        origin=f"origin_{MARK}",
        destination=f"dest_{MARK}",
        business_group=f"group_{MARK}",
        tenant=TENANT,
    )
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", record)
    try:
        app.enqueue(None, task, {"v": f"payload_{MARK}", "fail": False}, **columns)
        app.enqueue(None, task, {"v": f"payload_{MARK}'--", "fail": True}, **columns)
        app.enqueue_many(
            None, [{"task": task, "payload": {"v": MARK, "fail": False}, **columns}] * 3
        )
        app.find_equivalent(None, task, {"v": f"payload_{MARK}", "fail": False}, **columns)
        backend.run_worker(app, batch_size=5)
        dead = [row["id"] for row in app.dead_jobs(queue=queue)]
        assert dead and app.requeue_dead(dead) == dead
        app.stats()
        app.get_job(dead[0])
        for routine in ("rescue", "purge", "renotify"):
            app.run_maintenance(routine, strategy=backend.strategy)
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", record)

    assert len(statements) > 10
    inlined = [s for s in statements if MARK in s or str(TENANT) in s]
    assert inlined == [], inlined
    jobs = backend.jobs()
    assert any(j["result"] == f"done_{MARK}" for j in jobs)  # the values did reach the table
    assert any(j["payload"] == {"v": f"payload_{MARK}'--", "fail": True} for j in jobs)

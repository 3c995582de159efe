"""``python -m dbqueue.db_gen <schema> <queue>``: the seed's DDL generator.

The printed SQL is executed as a DBA would (one script, on a fresh PostgreSQL schema), then a
real worker runs jobs and a publication against the tables it made.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import sqlalchemy as sa
from support.backends import PREFIX

import dbqueue
from dbqueue.compat import db_gen

SCHEMA = f"dbgen_{PREFIX.rstrip('_')}"
QUEUE = "fila_teste"


def run_module(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DBQUEUE_", "DB_", "QUEUE_"))}
    return subprocess.run(
        [sys.executable, "-m", "dbqueue.db_gen", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def execute_script(engine: sa.Engine, script: str) -> None:
    """Run the whole printed script in one go, as psql -f would."""
    raw = engine.raw_connection()
    try:
        raw.driver_connection.autocommit = True
        with raw.driver_connection.cursor() as cursor:
            cursor.execute(script)
    finally:
        raw.close()


def seed_app(url: str) -> dbqueue.App:
    return dbqueue.App(
        url, schema=SCHEMA, jobs_table=QUEUE, subscriptions_table=f"{QUEUE}_subscriber"
    )


def test_the_printed_ddl_creates_working_tables_on_postgresql(postgresql):
    printed = run_module(SCHEMA, QUEUE)
    assert printed.returncode == 0 and printed.stderr == "", printed.stderr
    admin = sa.create_engine(postgresql.url)
    with admin.begin() as conn:
        conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        conn.execute(sa.text(f"CREATE SCHEMA {SCHEMA}"))
    app = seed_app(postgresql.url)
    try:
        execute_script(admin, printed.stdout)
        inspector = sa.inspect(admin)
        assert {QUEUE, f"{QUEUE}_subscriber"} <= set(inspector.get_table_names(schema=SCHEMA))
        assert not inspector.has_table(QUEUE)  # nothing in the default schema

        done = []

        @app.task("faturar")
        def faturar(job, session):
            done.append(job["processo"])
            return "faturado"

        @app.subscriber("pedido_criado", "assinante")
        def assinante(job, session):
            done.append(job["subscriber_id"])

        app.add_subscription(None, "assinante", "pedido_criado")
        job_id = app.enqueue(None, "faturar", {"pedido": 1})
        publication_id = app.publish(None, "pedido_criado", {"pedido": 1})
        app.run_worker(burst=True, poll_interval=0.02, install_signal_handlers=False)
        assert sorted(done) == ["assinante", "faturar"]
        assert app.get_job(job_id)["result"] == "faturado"
        assert app.get_job(publication_id)["message"].endswith(": assinante")
    finally:
        app.engine.dispose()
        with admin.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        admin.dispose()


def test_the_dialect_or_url_picks_the_database_without_connecting(capsys):
    assert db_gen.main(["s", "q"]) == 0
    postgresql = capsys.readouterr().out
    assert "BIGSERIAL" in postgresql and "CREATE TRIGGER q_notify" in postgresql
    assert "CREATE TABLE s.q_subscriber" in postgresql
    assert db_gen.main(["s", "q", "--dialect", "mysql"]) == 0
    mysql = capsys.readouterr().out
    assert "AUTO_INCREMENT" in mysql and "BIGSERIAL" not in mysql
    assert db_gen.main(["s", "q", "--url", "mysql+pymysql://nobody@127.0.0.1:1/none"]) == 0
    assert capsys.readouterr().out == mysql


@pytest.mark.parametrize(
    "argv, fragment",
    [
        ([], "<schema> <queue>"),
        (["only_schema"], "<schema> <queue>"),
        (["s", "q", "extra"], "extra"),
        (["s", "bad-name"], "'bad-name'"),
        (["s;drop", "q"], "'s;drop'"),
        (["s", "q", "--dialect", "oracle"], "oracle"),
        (["s", "q", "--url", "not a url"], "cannot parse"),
        (["s", "q", "--dialect", "mysql", "--url", "postgresql://h/db"], "does not match"),
    ],
)
def test_bad_arguments_give_one_error_line(argv, fragment, capsys):
    assert db_gen.main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), captured.err
    assert fragment in lines[0]


def test_the_module_exits_1_on_bad_arguments():
    result = run_module("s")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("Error: ") and len(result.stderr.splitlines()) == 1

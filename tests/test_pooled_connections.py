"""dbqueue's engines hand out pooled connections without the round trips a one-job enqueue
does not need (a ping of a connection used a moment ago; PyMySQL's ROLLBACK after a COMMIT),
and still never hand out a dead connection or one inside a transaction."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from support.backends import MYSQL_URL, POSTGRESQL_URL

from dbqueue import dialects
from dbqueue.dialects import connect


def _session_counter(conn: sa.Connection, name: str) -> int:
    row = conn.exec_driver_sql(f"SHOW SESSION STATUS LIKE '{name}'").one()
    return int(row[1])


def test_mysql_connection_returned_after_a_commit_gets_no_rollback() -> None:
    engine = dialects.create_engine(MYSQL_URL)
    try:
        with engine.connect() as conn:
            before = _session_counter(conn, "Com_rollback")
            conn.rollback()
        for _ in range(3):
            with engine.begin() as conn:
                conn.exec_driver_sql("SELECT 1")
        with engine.connect() as conn:
            # The pool's reset after each COMMIT sent no ROLLBACK (it used to: one each).
            assert _session_counter(conn, "Com_rollback") == before + 1  # our own, above
    finally:
        engine.dispose()


def test_mysql_connection_returned_inside_a_transaction_is_rolled_back() -> None:
    engine = dialects.create_engine(MYSQL_URL)
    try:
        raw = engine.raw_connection()
        cursor = raw.cursor()
        cursor.execute("CREATE TEMPORARY TABLE enqueue_pool_probe (x INT) ENGINE=InnoDB")
        cursor.execute("INSERT INTO enqueue_pool_probe VALUES (1)")  # opens a transaction
        cursor.close()
        raw.close()  # back to the pool with the transaction open
        with engine.connect() as conn:  # the same connection (the temporary table is there)
            count = conn.exec_driver_sql("SELECT COUNT(*) FROM enqueue_pool_probe").scalar()
            assert count == 0  # the reset rolled the insert back
    finally:
        engine.dispose()


@pytest.mark.parametrize("url", [POSTGRESQL_URL, MYSQL_URL], ids=["postgresql", "mysql"])
def test_connection_closed_by_the_server_while_idle_is_replaced(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = dialects.create_engine(url)
    admin = sa.create_engine(url)
    postgres = engine.dialect.name == "postgresql"
    own_id = "SELECT pg_backend_pid()" if postgres else "SELECT CONNECTION_ID()"
    kill = "SELECT pg_terminate_backend({})" if postgres else "KILL {}"
    try:
        with engine.connect() as conn:
            server_id = conn.exec_driver_sql(own_id).scalar()
        with admin.connect() as conn:
            conn.exec_driver_sql(kill.format(int(server_id)))
            conn.commit()
        time.sleep(0.2)
        # Idle longer than the threshold (here: any time at all): pinged, found dead, replaced.
        monkeypatch.setattr(connect, "PING_AFTER_IDLE", 0.0)
        with engine.begin() as conn:
            assert conn.exec_driver_sql(own_id).scalar() != server_id
    finally:
        engine.dispose()
        admin.dispose()


@pytest.mark.parametrize("url", [POSTGRESQL_URL, MYSQL_URL], ids=["postgresql", "mysql"])
def test_connection_used_a_moment_ago_is_not_pinged(url: str) -> None:
    engine = dialects.create_engine(url)
    pings: list[object] = []
    real_ping = engine.dialect.do_ping

    def counted_ping(dbapi_connection: object) -> bool:
        pings.append(dbapi_connection)
        return real_ping(dbapi_connection)

    engine.dialect.do_ping = counted_ping  # type: ignore[method-assign]
    try:
        for _ in range(5):
            with engine.begin() as conn:
                conn.exec_driver_sql("SELECT 1")
        assert pings == []
        time.sleep(connect.PING_AFTER_IDLE + 0.1)
        with engine.begin() as conn:
            conn.exec_driver_sql("SELECT 1")
        assert len(pings) == 1
    finally:
        engine.dispose()

"""Real tenant databases for the tenant tests: PostgreSQL and MariaDB databases, each with a
``notes`` table a handler writes to. Created once and kept (creation is the slow part), so a
run only empties their tables. Names start with DBQUEUE_TEST_PREFIX (not the xdist worker's
suffix: each file that uses a set runs in one process), so helpers sharing the servers keep
apart.
"""

from __future__ import annotations

import contextlib
import os

import sqlalchemy as sa

from support.backends import MYSQL_URL, POSTGRESQL_URL

BASE = os.environ.get("DBQUEUE_TEST_PREFIX", "dbqt_")

metadata = sa.MetaData()
notes = sa.Table(
    "notes",
    metadata,
    sa.Column("job_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("tenant", sa.String(40)),
    sa.Column("attempt", sa.Integer),
    mysql_engine="InnoDB",
)


def url_on(server_url: str, database: str) -> str:
    return sa.engine.make_url(server_url).set(database=database).render_as_string(False)


def postgresql_databases(names: list[str]) -> dict[str, str]:
    """name → URL of PostgreSQL databases (created when missing), their notes tables empty."""
    admin = sa.create_engine(POSTGRESQL_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            have = set(conn.scalars(sa.text("SELECT datname FROM pg_database")))
            for name in names:
                if name not in have:
                    # ProgrammingError: created meanwhile by another run
                    with contextlib.suppress(sa.exc.ProgrammingError):
                        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    urls = {name: url_on(POSTGRESQL_URL, name) for name in names}
    for url in urls.values():
        _fresh_notes(url)
    return urls


def mysql_databases(names: list[str]) -> dict[str, str]:
    """name → URL of MariaDB databases (created when missing), their notes tables empty; one
    connection does it all, so that 200 of them take a moment."""
    engine = sa.create_engine(MYSQL_URL)
    try:
        with engine.begin() as conn:
            tables = set(
                conn.scalars(
                    sa.text(
                        "SELECT table_schema FROM information_schema.tables "
                        "WHERE table_name = 'notes'"
                    )
                )
            )
            for name in names:
                if name not in tables:
                    conn.execute(sa.text(f"CREATE DATABASE IF NOT EXISTS `{name}`"))
                    conn.execute(
                        sa.text(
                            f"CREATE TABLE IF NOT EXISTS `{name}`.notes (job_id BIGINT PRIMARY "
                            "KEY, tenant VARCHAR(40), attempt INT) ENGINE=InnoDB"
                        )
                    )
                else:
                    conn.execute(sa.text(f"DELETE FROM `{name}`.notes"))
    finally:
        engine.dispose()
    # ssl_disabled: pymysql ≥ 1.2 builds a TLS context per connection (~0.2 s of CPU here).
    return {name: url_on(MYSQL_URL, name) + "?ssl_disabled=true" for name in names}


def _fresh_notes(url: str) -> None:
    engine = sa.create_engine(url)
    try:
        metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(notes.delete())
    finally:
        engine.dispose()


def rows(url: str) -> list[tuple[int, str, int]]:
    """(job_id, tenant, attempt) of a tenant database's notes, sorted."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return sorted(tuple(r) for r in conn.execute(sa.select(notes)))  # type: ignore[misc]
    finally:
        engine.dispose()

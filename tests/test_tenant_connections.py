"""200 tenant databases (MariaDB) served by one worker whose tenant cache holds 20 engines:
the connections open on the server, and the worker's file descriptors, stay bounded by the
cache (20 engines × a pool of 1, plus one per worker thread), never by the number of tenants."""

from __future__ import annotations

import os

import sqlalchemy as sa
from support.backends import MYSQL_URL
from support.tenant_dbs import BASE, mysql_databases, notes, rows

TENANTS = 200
CACHE = 20
THREADS = 2
REVISITED = 20  # tenants that get a second job, long after their engine was evicted

_OPEN = sa.text(
    "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB REGEXP :pattern"
).bindparams(pattern=f"^{BASE}t[0-9]+$")


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_200_tenants_through_a_cache_of_20_hold_the_connection_bound(postgresql):
    urls = mysql_databases([f"{BASE}t{i}" for i in range(TENANTS)])
    # pymysql ≥ 1.2 builds a TLS context for every connection (TLS "preferred"): about 0.2 s of
    # CPU each here, for a local server that offers none. Each evicted tenant reconnects.
    template = MYSQL_URL.rsplit("/", 1)[0] + f"/{BASE}t{{tenant}}?ssl_disabled=true"
    app = postgresql.app(tenant_databases=template, tenant_cache_size=CACHE)
    tenants = app.context.tenants
    samples: list[tuple[int, int, int]] = []  # (server connections, fds, cached engines)

    @app.task("note", tenant_database=True)
    def handler(job, session, tenant_session):
        tenant_session.execute(
            notes.insert().values(job_id=job.id, tenant=str(job.tenant), attempt=job.attempt)
        )
        open_now = tenant_session.execute(_OPEN).scalar_one()
        samples.append((open_now, _fds(), len(tenants.cached())))

    order = [*range(TENANTS), *range(REVISITED)]
    ids = app.enqueue_many(None, [{"task": "note", "tenant": t} for t in order])
    monitor = sa.create_engine(MYSQL_URL)
    try:
        with monitor.connect() as conn:
            assert conn.execute(_OPEN).scalar_one() == 0
        fds_before = _fds()
        summary = postgresql.run_worker(app, concurrency=THREADS)
        assert (summary.succeeded, summary.failed) == (len(order), 0)

        # Every tenant got its own jobs' rows, and only those.
        expected: dict[int, list[int]] = {}
        for job_id, tenant in zip(ids, order, strict=True):
            expected.setdefault(tenant, []).append(job_id)
        for tenant in (0, 1, 19, 20, 123, 199):
            found = rows(urls[f"{BASE}t{tenant}"])
            assert [r[0] for r in found] == expected[tenant]
            assert {r[1] for r in found} == {str(tenant)}

        # The bound: at most CACHE pooled connections plus one in use per thread.
        assert len(samples) == len(order)
        most_open = max(s[0] for s in samples)
        assert most_open <= CACHE + THREADS, f"{most_open} tenant connections open at once"
        assert max(s[2] for s in samples) <= CACHE
        # Without the bound each of the 200 tenants would keep a socket open.
        assert max(s[1] for s in samples) - fds_before <= CACHE + THREADS + 30
        # Each revisited tenant's engine had been evicted (and disposed), so it was made anew.
        assert tenants.created == len(order)
        # The worker disposed every engine on its way out: no tenant connection is left.
        assert tenants.disposed == tenants.created
        with monitor.connect() as conn:
            assert conn.execute(_OPEN).scalar_one() == 0
    finally:
        monitor.dispose()

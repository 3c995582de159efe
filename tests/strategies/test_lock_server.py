"""The lock_server strategy on a database that admits one writer at a time (SQLite): the batch
transaction's write lock is the claim, as the sqlite strategy's, so a batch is one transaction,
one commit, and no lock per job on the server; the server still pushes the wake-ups. (Its
guarantees run in the contract and chaos suites as the ``sqlite-lock_server`` pair.)"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from support.lockserver import RawClient, ServerProcess, start_server

import dbqueue
from dbqueue import dialects, strategies
from dbqueue.strategies.locks import job_lock_name


@pytest.fixture
def served(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    dbqueue.App(url).migrate()
    server = start_server(url, "dbqueue_", tmp_path / "server.log")
    try:
        yield url, server
    finally:
        assert server.stop() == 0


def _takes(server: ServerProcess, name: str) -> bool:
    """Whether another client can take the lock ``name`` now (and gives it back)."""
    with RawClient(server.host, server.port) as client:
        assert client.hello(token=server.token)["ok"]
        taken = client.request({"op": "acquire", "id": 1, "names": [name], "owner": "test"})
        return taken["taken"] == [True]


def test_on_a_single_writer_database_lock_server_claims_in_the_batch_transaction() -> None:
    sqlite = dialects.class_for_url(sa.engine.make_url("sqlite:///x.db"))
    chosen = strategies.resolve("lock_server", sqlite)
    assert chosen.name == "lock_server" and chosen.claims_through_lock_server
    assert chosen.claims_in_transaction and not chosen.waits_holding_claims
    mysql = dialects.class_for_url(sa.engine.make_url("mysql+pymysql://u@h/d"))
    assert not strategies.resolve("lock_server", mysql).claims_in_transaction


def _drain(app: dbqueue.App, strategy: str) -> int:
    """Run a burst worker (one thread, batches of ten); the commits sent meanwhile."""
    commits: list[int] = []
    lock = threading.Lock()

    def counted(conn: Any) -> None:
        with lock:
            commits.append(1)

    sa.event.listen(sa.engine.Engine, "commit", counted)
    try:
        worker = app.worker(
            concurrency=1, batch_size=10, burst=True, maintenance=False, strategy=strategy
        )
        worker.run()
    finally:
        sa.event.remove(sa.engine.Engine, "commit", counted)
    assert worker.strategy is not None and worker.strategy.name == strategy
    return len(commits)


def test_a_batch_is_one_commit_with_no_job_lock_on_the_server(served: Any) -> None:
    url, server = served
    app = dbqueue.App(url, lock_server=server.address)
    seen: list[tuple[int, str, bool]] = []
    reader = sa.create_engine(url)

    @app.task("t")
    def handler(job: dbqueue.Job, session: Any) -> None:
        name = job_lock_name(app.names.qualified_jobs, job.id)
        with reader.connect() as other:  # what another connection sees
            status = other.execute(
                sa.text(f"SELECT status FROM {app.names.jobs} WHERE id = :id"), {"id": job.id}
            ).scalar_one()
        seen.append((job.id, status, _takes(server, name)))

    try:
        ids = [app.enqueue(None, "t", {"n": n}) for n in range(20)]
        with_server = _drain(app, "lock_server")
        assert [job_id for job_id, _, _ in seen] == ids
        # Nothing committed 'running' (the claim is uncommitted until the outcome), and the
        # server holds no lock on the job while its handler runs, nor any after.
        assert {(status, free) for _, status, free in seen} == {("available", True)}
        assert {app.get_job(job_id)["status"] for job_id in ids} == {"succeeded"}
        assert server.stats()["locks"] == 0
        # The same drain with the sqlite strategy commits as often: one commit per batch
        # (a claim committed on its own would add one per batch, two here).
        more = [app.enqueue(None, "t", {"n": n}) for n in range(20)]
        assert _drain(app, "sqlite") == with_server
        assert {app.get_job(job_id)["status"] for job_id in more} == {"succeeded"}
    finally:
        reader.dispose()

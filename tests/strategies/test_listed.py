"""Ids listed once for several claims (``strategies/listed.py``): the list's own rules, then the
lock_server claim that uses it, against a real ``dbqueue server`` on each database where that
claim takes a lock per job (on SQLite the write lock is the claim): how often it lists, and that
a stale list never makes a claim come back empty while jobs wait."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from support.backends import backend_keys

import dbqueue
from dbqueue.job import Status
from dbqueue.strategies.listed import ListedCandidates
from dbqueue.strategies.locks import job_lock_name


class Lister:
    """``list_ids`` over a fixed line of ids, counting its calls."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.calls = 0

    def __call__(self, size: int) -> list[int]:
        self.calls += 1
        return self.ids[:size]


def test_one_listing_serves_claims_until_it_is_used_up() -> None:
    listed = ListedCandidates(size=25, max_age=60)
    lister = Lister(list(range(1, 101)))
    taken = [listed.take("q", 10, 0, lister) for _ in range(2)]
    assert taken == [list(range(1, 11)), list(range(11, 21))]
    assert lister.calls == 1
    # Five left, fewer than wanted: listed again.
    assert listed.take("q", 10, 0, lister) == list(range(1, 11))
    assert lister.calls == 2
    assert listed.take("q", 5, 0, lister) == list(range(11, 16))


def test_a_claim_that_lists_keeps_its_own_part_and_leaves_the_rest_in_order() -> None:
    listed = ListedCandidates(size=40, max_age=60)
    lister = Lister(list(range(1, 41)))
    assert listed.take("q", 10, 2, lister) == list(range(21, 31))
    assert listed.take("q", 10, 0, lister) == list(range(1, 11))
    assert listed.take("q", 10, 0, lister) == list(range(11, 21))
    assert listed.take("q", 10, 0, lister) == list(range(31, 41))
    assert lister.calls == 1
    short = ListedCandidates(size=40, max_age=60)
    assert short.take("q", 10, 3, Lister([7, 8, 9])) == [7, 8, 9]  # shorter than its part


def test_a_list_is_listed_again_once_too_old_or_forgotten() -> None:
    listed = ListedCandidates(size=100, max_age=0.05)
    lister = Lister(list(range(1, 101)))
    listed.take("q", 10, 0, lister)
    time.sleep(0.1)
    assert listed.take("q", 10, 0, lister) == list(range(1, 11))
    listed.forget("q")
    assert listed.take("q", 10, 0, lister) == list(range(1, 11))
    assert listed.take("other", 10, 0, lister) == list(range(1, 11))  # one list per queue
    assert lister.calls == 4


#: The lock_server pairs whose claim lists candidates and locks them on the server.
LISTING_BACKENDS = backend_keys(
    lambda spec: spec.claims_through_lock_server and spec.commits_claims
)


@pytest.fixture
def claiming(backend: Any) -> Iterator[tuple[dbqueue.App, Any, Any, list[str]]]:
    """An App with a lock server, its lock_server strategy, a connection, and the candidate
    listings it sends (SQL text)."""
    app = backend.app()
    context = app.context.reconfigured(strategy="lock_server")
    engine = context.create_engine()
    listings: list[str] = []
    listing = f"SELECT {app.names.jobs}.ID FROM".upper()

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if " ".join(statement.split()).upper().startswith(listing):
            listings.append(statement)

    sa.event.listen(engine, "before_cursor_execute", note)
    with engine.connect() as conn:
        strategy = context.open_strategy(context.check_database(engine))
        try:
            yield app, strategy, conn, listings
        finally:
            strategy.close()
            engine.dispose()


@pytest.mark.parametrize("backend", LISTING_BACKENDS, indirect=True)
def test_claims_list_once_for_a_run_of_claims(claiming: Any) -> None:
    app, strategy, conn, listings = claiming
    ids = [app.enqueue(None, "t", {"i": i}) for i in range(50)]
    queue_engine = app.context.queue_engine(conn)
    claimed = [strategy.claim(conn, queue_engine.claims, "default", 10, "w1") for _ in range(5)]
    assert [[job.id for job in jobs] for jobs in claimed] == [
        ids[i : i + 10] for i in range(0, 50, 10)
    ]
    assert len(listings) == 1
    assert all(job.status == Status.RUNNING for jobs in claimed for job in jobs)


@pytest.mark.parametrize("backend", LISTING_BACKENDS, indirect=True)
def test_a_stale_list_is_dropped_and_the_claim_still_takes_waiting_jobs(claiming: Any) -> None:
    app, strategy, conn, listings = claiming
    ids = [app.enqueue(None, "t", {"i": i}) for i in range(40)]
    queue_engine = app.context.queue_engine(conn)
    assert [
        job.id for job in strategy.claim(conn, queue_engine.claims, "default", 10, "w1")
    ] == ids[:10]
    jobs = app.names.jobs
    with app.engine.begin() as other:  # another worker finished the next twenty meanwhile
        other.execute(
            sa.text(f"UPDATE {jobs} SET status = 'succeeded' WHERE id BETWEEN :a AND :b"),
            {"a": ids[10], "b": ids[29]},
        )
    takes: list[list[int]] = []
    take = strategy.listed.take
    strategy.listed.take = lambda *args: takes.append(take(*args)) or takes[-1]
    second = strategy.claim(conn, queue_engine.claims, "default", 10, "w1")
    assert [job.id for job in second] == ids[30:40]
    # Its first try met the stale ids; the list was dropped, and listed afresh at once.
    assert takes == [ids[10:20], ids[30:40]]
    assert len(listings) == 2
    # The locks of the ids it could not mark were let go: another client takes them.
    name = job_lock_name(app.names.qualified_jobs, ids[10])
    assert strategy.locks.holding(conn, [name]) is False

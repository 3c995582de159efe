"""Conformance of every claim strategy on every database it runs on: each public member of
``dbqueue.strategies.base.ClaimStrategy`` exercised for every (database, strategy) pair of
BACKENDS, on real connections, driven as the worker drives it (``claim_and_run``): a claim in
the batch transaction where ``claims_in_transaction``, else committed and then released. A new
strategy passes this file (and ``test_every_member_of_claimstrategy_has_a_conformance_test``
keeps it complete).

Each test has a queue of its own (the pair's tables are emptied once per module) and a
strategy opened for it alone (a lock-based strategy numbers its worker threads' windows in the
order they first claim: the first claims from the head of the line).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from support.backends import Backend
from support.conformance import Checklist
from support.waiting import wait_for

import dbqueue
from dbqueue import strategies
from dbqueue.dialects import WRITE_INTENT, Dialect
from dbqueue.errors import StrategyNotSupportedError
from dbqueue.job import Job, Status
from dbqueue.runtime.context import RuntimeContext
from dbqueue.strategies import ClaimStrategy
from dbqueue.strategies.locks import LockBackend, job_lock_name

CHECKLIST = Checklist(ClaimStrategy)
covers = CHECKLIST.covers
_queues = itertools.count()


@dataclass
class Pair:
    """One (database, strategy) pair: its App, a context configured with its strategy, the
    worker's kind of engine (write intent: SQLite's claims take the write lock at BEGIN), and
    the connected Dialect."""

    backend: Backend
    app: dbqueue.App
    context: RuntimeContext
    engine: sa.Engine
    dialect: Dialect


@pytest.fixture(scope="module")
def pair(each_backend: Backend) -> Iterator[Pair]:
    app = each_backend.app()
    context = app.context.reconfigured(strategy=each_backend.strategy)
    engine = context.create_engine(execution_options={WRITE_INTENT: True})
    try:
        yield Pair(each_backend, app, context, engine, context.check_database(engine))
    finally:
        engine.dispose()
        app.engine.dispose()


@dataclass
class Claiming:
    """A strategy opened for one test, on a queue of the test's own."""

    pair: Pair
    strategy: ClaimStrategy
    queue: str

    def claims(self, conn: sa.Connection) -> Any:
        return self.pair.context.queue_engine(conn).claims

    def enqueue(self, *priorities: int, **options: Any) -> list[int]:
        """One job per priority (separate enqueues, in this order), in this test's queue."""
        options.setdefault("queue", self.queue)
        task = options.pop("task", "t")
        return [
            self.pair.app.enqueue(None, task, {"n": n}, priority=p, **options)
            for n, p in enumerate(priorities)
        ]

    def statuses(self, ids: list[int]) -> list[str]:
        """The jobs' statuses as another connection sees them (committed)."""
        jobs = self.pair.app.tables.jobs
        with self.pair.app.engine.connect() as conn:
            rows = conn.execute(sa.select(jobs.c.id, jobs.c.status).where(jobs.c.id.in_(ids)))
            found = {job_id: status for job_id, status in rows}
        return [found[job_id] for job_id in ids]

    def claim(self, conn: sa.Connection, call: Callable[..., Any], *args: Any) -> Any:
        """``call(conn, claims, *args)`` as the worker makes it: in the batch transaction it
        opens where the claim lives there (left open), else committing on its own."""
        if self.strategy.claims_in_transaction:
            conn.begin()
        return call(conn, self.claims(conn), *args)

    def finish(self, conn: sa.Connection, jobs: list[Job], worker_id: str) -> None:
        """Their success, fenced as the claim's kind says, then the claim let go: the batch
        transaction commits it, or it commits alone and the locks are released."""
        fence = self.strategy.fence(worker_id)
        outcomes = self.pair.context.queue_engine(conn).outcomes
        done = [(job, None) for job in jobs]
        if self.strategy.claims_in_transaction:
            assert outcomes.complete(conn, done, fence) == len(jobs)
            conn.commit()
            return
        with conn.begin():
            assert outcomes.complete(conn, done, fence) == len(jobs)
        self.strategy.release(conn, self.claims(conn), jobs)

    def names(self, jobs: list[Job]) -> list[str]:
        return [job_lock_name(self.pair.app.names.qualified_jobs, job.id) for job in jobs]


@pytest.fixture
def claiming(pair: Pair) -> Iterator[Claiming]:
    strategy = pair.context.open_strategy(pair.dialect)
    try:
        yield Claiming(pair, strategy, f"conf{next(_queues)}")
    finally:
        strategy.close()


def ids(jobs: list[Job] | None) -> list[int]:
    return [job.id for job in jobs or []]


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``call`` in a thread; its result (or error) lands in the dict."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except BaseException as exc:  # reported by the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def result_of(thread: threading.Thread, outcome: dict[str, Any]) -> Any:
    thread.join(60)
    assert not thread.is_alive(), "the other claim never returned"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


@contextlib.contextmanager
def other_owner(pair: Pair) -> Iterator[Callable[[Callable[[sa.Connection], Any]], Any]]:
    """Run calls as another owner of locks: one other thread, on a connection of its own (a
    database lock belongs to a connection, a lock server's to a thread)."""
    with ThreadPoolExecutor(max_workers=1) as thread, pair.engine.connect() as conn:
        yield lambda call: thread.submit(call, conn).result(60)


def wait_until_free(pair: Pair, locks: LockBackend, names: list[str]) -> None:
    """Wait until another owner can take every one of ``names``, then give them back: an
    ended session's locks go once the server has ended it."""
    with other_owner(pair) as other:

        def free() -> bool:
            taken = other(lambda c: locks.try_acquire(c, names))
            held = [name for name, ok in zip(names, taken, strict=True) if ok]
            other(lambda c: locks.release(c, held))
            return all(taken)

        wait_for(free, 30, "the locks to be let go")


# ---- the checklist -------------------------------------------------------------------------
def test_every_member_of_claimstrategy_has_a_conformance_test() -> None:
    assert CHECKLIST.problems(globals()) == []


# ---- which strategy, where -----------------------------------------------------------------
@covers("name", "for_dialect", "check_supported")
def test_the_strategy_is_the_one_named_and_refused_where_it_cannot_run(claiming: Claiming) -> None:
    pair, strategy = claiming.pair, claiming.strategy
    named = strategies.STRATEGIES[pair.backend.strategy]
    assert strategy.name == pair.backend.strategy == named.name
    assert type(strategy) is named.for_dialect(pair.dialect) is pair.backend.strategy_class
    type(strategy).check_supported(pair.dialect)  # raises if this server cannot
    for name, other in strategies.STRATEGIES.items():  # what BACKENDS does not pair: refused
        if name not in pair.backend.paired_strategies:
            with pytest.raises(StrategyNotSupportedError, match=name):
                other.for_dialect(pair.dialect).check_supported(pair.dialect)


# ---- claims --------------------------------------------------------------------------------
@covers("claim", "claims_in_transaction", "claimed_status", "attempt_increment", "fence")
def test_a_claim_takes_the_runnable_jobs_in_claim_order_and_never_twice(
    claiming: Claiming,
) -> None:
    """Two connections claim: each gets runnable jobs of its queue only, in claim order, none
    the other has (a second claimer on a single-writer database waits for the first), and
    their fences find the rows as the claim left them."""
    strategy = claiming.strategy
    jobs = claiming.enqueue(3, 0, 4, 1, 5, 2)
    order = [jobs[i] for i in (1, 3, 5, 0, 2, 4)]
    later = claiming.enqueue(0, delay=3600)  # not runnable yet
    elsewhere = claiming.enqueue(0, queue=f"{claiming.queue}-other")
    engine = claiming.pair.engine
    with engine.connect() as a, engine.connect() as b:
        first = claiming.claim(a, strategy.claim, claiming.queue, 3, "conf:a")
        assert ids(first) == order[:3]
        assert all(job.attempt == 1 for job in first)
        # A claim in the batch transaction commits nothing; a committed one says running.
        assert claiming.statuses(ids(first)) == [strategy.claimed_status] * 3
        expected = Status.AVAILABLE if strategy.claims_in_transaction else Status.RUNNING
        assert strategy.claimed_status == expected
        assert strategy.attempt_increment == (1 if strategy.claims_in_transaction else 0)
        fence = strategy.fence("conf:a")
        assert (fence.status, fence.attempt_increment, fence.worker_id) == (
            strategy.claimed_status,
            strategy.attempt_increment,
            "conf:a",
        )
        assert fence.claimed_by == (None if strategy.claims_in_transaction else "conf:a")
        if claiming.pair.dialect.single_writer:  # the second claimer waits for the first
            thread, outcome = in_thread(
                lambda: claiming.claim(b, strategy.claim, claiming.queue, 10, "conf:b")
            )
            assert "result" not in outcome
            claiming.finish(a, first, "conf:a")
            second = result_of(thread, outcome)
        else:
            second = claiming.claim(b, strategy.claim, claiming.queue, 10, "conf:b")
            claiming.finish(a, first, "conf:a")
        assert ids(second) == order[3:]
        claiming.finish(b, second, "conf:b")
    assert claiming.statuses(jobs) == [Status.SUCCEEDED] * 6
    assert claiming.statuses(later + elsewhere) == [Status.AVAILABLE] * 2


@covers("claim_limited")
def test_a_limited_claim_takes_a_free_slot_or_nothing(claiming: Claiming) -> None:
    """One slot: the first claim takes one job with it; while it holds, another claimer gets
    nothing (None: every slot taken) — or, on a single-writer database, waits for the first
    batch to end — and once it is let go, the next job."""
    strategy, queue = claiming.strategy, claiming.queue
    jobs = claiming.enqueue(0, 1, 2)
    engine = claiming.pair.engine
    with engine.begin() as conn:
        claiming.pair.context.queue_engine(conn).slots.ensure_slots(conn, queue, 1)
    with engine.connect() as a, engine.connect() as b:
        first = claiming.claim(a, strategy.claim_limited, queue, 10, "conf:a", 1)
        assert ids(first) == jobs[:1]
        if claiming.pair.dialect.single_writer:
            thread, outcome = in_thread(
                lambda: claiming.claim(b, strategy.claim_limited, queue, 10, "conf:b", 1)
            )
            assert "result" not in outcome
            claiming.finish(a, first, "conf:a")
            second = result_of(thread, outcome)
            assert ids(second) == jobs[1:2]
            claiming.finish(b, second, "conf:b")
            return
        assert claiming.claim(b, strategy.claim_limited, queue, 10, "conf:b", 1) is None
        if strategy.claims_in_transaction:
            b.rollback()
        claiming.finish(a, first, "conf:a")
        second = claiming.claim(b, strategy.claim_limited, queue, 10, "conf:b", 1)
        assert ids(second) == jobs[1:2]
        claiming.finish(b, second, "conf:b")


@covers("claim_ids")
def test_an_eager_claim_takes_the_waiting_ones_of_its_ids_whatever_their_run_at(
    claiming: Claiming,
) -> None:
    strategy = claiming.strategy
    [due] = claiming.enqueue(0)
    [delayed] = claiming.enqueue(0, delay=3600)
    [done] = claiming.enqueue(0)
    engine = claiming.pair.engine
    with engine.connect() as a, engine.connect() as b:
        finished = claiming.claim(a, strategy.claim_ids, [done], "conf:a")
        claiming.finish(a, finished, "conf:a")
        wanted = [delayed, due, done]
        got = claiming.claim(a, strategy.claim_ids, wanted, "conf:a")
        assert sorted(ids(got)) == sorted([due, delayed])  # not the finished one
        if claiming.pair.dialect.single_writer:
            thread, outcome = in_thread(
                lambda: claiming.claim(b, strategy.claim_ids, wanted, "conf:b")
            )
            assert "result" not in outcome
            claiming.finish(a, got, "conf:a")
            assert result_of(thread, outcome) == []
            b.rollback()
        else:
            assert claiming.claim(b, strategy.claim_ids, wanted, "conf:b") == []
            if strategy.claims_in_transaction:
                b.rollback()
            claiming.finish(a, got, "conf:a")
    assert claiming.statuses([due, delayed, done]) == [Status.SUCCEEDED] * 3


@covers("claim_task")
def test_a_batch_gathers_more_jobs_of_its_task_only(claiming: Claiming) -> None:
    strategy = claiming.strategy
    batch = claiming.enqueue(0, 1, 2, 3, task="batch")
    other = claiming.enqueue(0, 0, task="other")
    with claiming.pair.engine.connect() as conn:
        first = claiming.claim(conn, strategy.claim, claiming.queue, 1, "conf:a")
        assert ids(first) == batch[:1]  # the line's head: priority 0, enqueued first
        gathered = strategy.claim_task(
            conn, claiming.claims(conn), claiming.queue, "batch", 10, "conf:a", first
        )
        assert ids(gathered) == batch[1:]  # in claim order, not the other task's
        claiming.finish(conn, first + gathered, "conf:a")
    assert claiming.statuses(batch) == [Status.SUCCEEDED] * 4
    assert claiming.statuses(other) == [Status.AVAILABLE] * 2


@covers("waits_holding_claims")
def test_a_worker_may_wait_holding_a_claim_only_where_enqueues_still_commit(
    claiming: Claiming,
) -> None:
    """Where a claim holds the database's one write lock, an enqueue cannot commit until the
    batch ends: a worker must not wait for more jobs holding it."""
    strategy, pair = claiming.strategy, claiming.pair
    holds_the_write_lock = strategy.claims_in_transaction and pair.dialect.single_writer
    assert strategy.waits_holding_claims == (not holds_the_write_lock)
    claiming.enqueue(0)
    impatient = pair.backend.impatient_engine(1)
    try:
        with pair.engine.connect() as conn:
            claimed = claiming.claim(conn, strategy.claim, claiming.queue, 1, "conf:a")
            jobs = pair.app.tables.jobs
            enqueue = sa.insert(jobs).values(task="t", queue=claiming.queue)
            with impatient.connect() as writer:
                if holds_the_write_lock:
                    with pytest.raises(sa.exc.OperationalError):
                        writer.execute(enqueue)
                    writer.rollback()
                else:
                    writer.execute(enqueue)
                    writer.commit()
            claiming.finish(conn, claimed, "conf:a")
    finally:
        impatient.dispose()


# ---- letting go ----------------------------------------------------------------------------
@covers("release", "release_jobs", "releases_with_outcome", "holds", "ask_holds", "liveness_locks")
def test_a_claim_holds_its_jobs_until_released_and_their_locks_tell_it(
    claiming: Claiming,
) -> None:
    """While claimed, the strategy holds the jobs (``holds``, asked now or later); a committed
    claim's job locks keep other owners out — rescue's liveness test — until its outcome
    releases them, in the outcome's transaction where the locks allow."""
    strategy, pair = claiming.strategy, claiming.pair
    jobs = claiming.enqueue(0, 1)
    locks = strategy.liveness_locks
    with pair.engine.connect() as conn, other_owner(pair) as other:
        claimed = claiming.claim(conn, strategy.claim, claiming.queue, 2, "conf:a")
        claims = claiming.claims(conn)
        assert ids(claimed) == jobs
        assert strategy.holds(conn, claims, claimed)
        answer = strategy.ask_holds(claims, claimed)
        assert answer(conn)
        names = claiming.names(claimed)
        if strategy.claims_in_transaction:  # the claim is the transaction's: nothing to free
            assert not strategy.releases_with_outcome
            claiming.finish(conn, claimed, "conf:a")
            strategy.release(conn, claims, claimed)
        else:
            assert locks is not None
            assert other(lambda c: locks.try_acquire(c, names)) == [False, False]
            fence = strategy.fence("conf:a")
            with conn.begin():
                outcomes = pair.context.queue_engine(conn).outcomes
                assert outcomes.complete(conn, [(job, None) for job in claimed], fence) == 2
                if strategy.releases_with_outcome:
                    strategy.release_jobs(conn, claims, claimed)
            strategy.release(conn, claims, claimed, jobs_released=strategy.releases_with_outcome)
        assert claiming.statuses(jobs) == [Status.SUCCEEDED] * 2
        if locks is None:  # nothing tells a live worker's running job from a dead one's
            assert not pair.dialect.supports_named_locks
            assert not strategy.claims_through_lock_server
            return
        # Free for anyone now; and exclusive: taken by one owner, refused to another.
        assert other(lambda c: locks.try_acquire(c, names)) == [True, True]
        assert locks.try_acquire(conn, names) == [False, False]
        other(lambda c: locks.release(c, names))


@covers("release_abandoned")
def test_an_abandoned_thread_s_claim_is_let_go_from_another_thread(claiming: Claiming) -> None:
    """The watchdog gives up a stuck thread: it ends the thread's connection, then lets go of
    whatever the thread's claim holds outside it. Its jobs' locks are free after."""
    strategy, pair = claiming.strategy, claiming.pair
    jobs = claiming.enqueue(0, 1)
    stuck = pair.engine.connect()
    try:
        thread, outcome = in_thread(
            lambda: (
                threading.get_ident(),
                claiming.claim(stuck, strategy.claim, claiming.queue, 2, "conf:stuck"),
            )
        )
        thread_id, claimed = result_of(thread, outcome)
        assert ids(claimed) == jobs
        assert pair.dialect.end_connection(pair.engine, stuck.connection.dbapi_connection)
        strategy.release_abandoned(claiming.claims(stuck), claimed, thread_id)
    finally:
        stuck.invalidate()
        stuck.close()
    if not strategy.claims_in_transaction:  # committed running, left for rescue: locks free
        assert claiming.statuses(jobs) == [Status.RUNNING] * 2
        assert strategy.liveness_locks is not None
        wait_until_free(pair, strategy.liveness_locks, claiming.names(claimed))
        return
    # Rolled back with the ended connection: another claim takes them once it has ended.
    with pair.engine.connect() as conn:
        again: list[Job] = []

        def claimed_again() -> bool:
            again[:] = claiming.claim(conn, strategy.claim, claiming.queue, 2, "conf:b")
            if ids(again) != jobs:
                conn.rollback()
            return ids(again) == jobs

        wait_for(claimed_again, 30, "the abandoned claim to roll back")
        claiming.finish(conn, again, "conf:b")


@covers("notifier", "claims_through_lock_server")
def test_the_lock_server_pushes_enqueues_to_its_strategy_s_notifier(claiming: Claiming) -> None:
    strategy, pair = claiming.strategy, claiming.pair
    notifier = strategy.notifier(pair.engine, pair.app.names)
    if not strategy.claims_through_lock_server:  # the database's own channel, or polling
        assert notifier is None
        return
    assert notifier is not None and notifier.pushes
    woken = threading.Event()
    notifier.start(woken.set, [claiming.queue])
    try:
        assert woken.wait(30), "the notifier never connected"  # it wakes once connected
        woken.clear()
        claiming.enqueue(0)  # the enqueue hints the server, which pushes
        assert woken.wait(30), "the enqueue woke nobody"
    finally:
        notifier.stop()


@covers("close")
def test_closing_lets_go_of_what_the_strategy_holds_itself(claiming: Claiming) -> None:
    """A lock taken through a lock server goes when the strategy closes the last use of its
    connection; a database lock belongs to a database connection, which closing leaves alone."""
    strategy, pair = claiming.strategy, claiming.pair
    name = job_lock_name(pair.app.names.qualified_jobs, 10**12)
    locks = strategy.liveness_locks
    if strategy.claims_through_lock_server:
        assert locks is not None
        # Another message timeout: a connection of its own, not the process's shared one.
        alone = pair.context.reconfigured(socket_timeout=29.5).open_strategy(pair.dialect)
        assert alone.liveness_locks is not None
        with pair.engine.connect() as conn, other_owner(pair) as other:
            assert alone.liveness_locks.try_acquire(conn, [name]) == [True]
            assert other(lambda c: locks.try_acquire(c, [name])) == [False]
            alone.close()
        wait_until_free(pair, locks, [name])
        return
    if locks is None:
        strategy.close()  # holds nothing: closing is harmless
        return
    with pair.engine.connect() as conn, other_owner(pair) as other:
        assert locks.try_acquire(conn, [name]) == [True]
        strategy.close()
        assert other(lambda c: locks.try_acquire(c, [name])) == [False]
        locks.release(conn, [name])

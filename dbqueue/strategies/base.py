"""How a claim is made exclusive: the interface each strategy module implements, what it needs
of the engine (``ClaimStatements``, which the engine's ``Claims`` part provides), and the fence a
claim leaves for the outcomes of its jobs (``Fence``)."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Any, ClassVar, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dbqueue.base.wakeup import Notifier
from dbqueue.config import Settings
from dbqueue.dialects import Dialect
from dbqueue.job import Job, Status
from dbqueue.schema.tables import TableNames
from dbqueue.strategies.locks import LockBackend

#: A named lock expression: the key read in the statement → the expression that takes it.
LockExpression = Callable[[sa.ColumnElement], sa.ColumnElement]
#: How a strategy locks a select it runs (``FOR UPDATE SKIP LOCKED``).
Locking = Callable[[sa.Select], sa.Select]


@dataclasses.dataclass(frozen=True, slots=True)
class Fence:
    """What an outcome's UPDATE must find in a claimed job's row for the job to still be this
    claim's, and what the claim left uncounted. Made where the claim is made
    (``ClaimStrategy.fence``), passed whole to every outcome: success, failure, retry,
    cancellation, rescue, and the undoing of a claim.

    ``status``: the row's status while the handler runs (``available`` under a claim held in
    the batch transaction, ``running`` under a committed one). ``attempt_increment``: 1 where
    the claim did not count the attempt. ``worker_id``: who records the outcome (written on
    the row). ``claimed_by``: only rows this worker claimed (committed claims: a job rescued
    and claimed again since belongs to someone else). ``same_attempt``: only the attempt that
    ran (an outcome written outside the claim's transaction, after it ended).
    ``lease_expired``: only while the job's lease has ended (rescue of a leased job)."""

    status: str
    attempt_increment: int
    worker_id: str
    claimed_by: str | None = None
    same_attempt: bool = False
    lease_expired: bool = False

    def guarded(self) -> Fence:
        """This fence, for an outcome written after the claim's transaction ended."""
        return dataclasses.replace(self, same_attempt=True)

    def recorded_by(self, worker_id: str) -> Fence:
        """This claim's fence, for an outcome written by another (the watchdog, for a thread
        it abandoned), after the claim's transaction ended."""
        return dataclasses.replace(self, worker_id=worker_id, same_attempt=True)

    @classmethod
    def rescue(cls, worker_id: str) -> Fence:
        """Rescue's fence: a ``running`` job whose worker died, whoever it was."""
        return cls(Status.RUNNING, 0, worker_id)

    @classmethod
    def lease_ended(cls, worker_id: str) -> Fence:
        """Rescue's fence for a leased job: ``running`` and its lease still over."""
        return cls(Status.RUNNING, 0, worker_id, lease_expired=True)

    @classmethod
    def leased(cls, worker_id: str) -> Fence:
        """The fence of a job run under a lease (whatever the strategy): its outcome, written
        after the claim committed, changes the row only if it still runs this attempt under
        this worker."""
        return cls(Status.RUNNING, 0, worker_id, claimed_by=worker_id, same_attempt=True)


class ClaimStatements(Protocol):
    """What a strategy uses of the engine to claim (``dbqueue.engine.claims.Claims``)."""

    #: What names the queue's locks: its jobs table, qualified.
    namespace: str

    def cached(self, key: Hashable, build: Callable[[], Any]) -> Any: ...
    def compiled(self, stmt: Any) -> Any: ...
    def runnable(
        self, queue: str | None = None, limit: int | None = None, locking: Locking | None = None
    ) -> sa.Select: ...
    def runnable_of_task(
        self, queue: str, task: str, limit: int, exclude: Sequence[int] = ()
    ) -> sa.Select: ...
    def waiting(self, ids: Sequence[int]) -> sa.Select: ...
    def free_slot(self, locking: Locking | None = None) -> sa.Select: ...
    def fetch_jobs(
        self, conn: Connection, stmt: sa.Select, queue: str, limit: int, attempt_increment: int
    ) -> list[Job]: ...
    def fetch_waiting(
        self, conn: Connection, stmt: sa.Select, attempt_increment: int
    ) -> list[Job]: ...
    def take_slot(
        self, conn: Connection, stmt: sa.Select, queue: str, slots: int
    ) -> int | None: ...
    def record_slot(
        self, conn: Connection, queue: str, slot: int, job_id: int, worker_id: str
    ) -> None: ...
    def candidate_ids(
        self, conn: Connection, queue: str, limit: int, offset: int = 0, task: str | None = None
    ) -> list[int]: ...
    def locked_candidates(
        self,
        conn: Connection,
        queue: str,
        limit: int,
        offset: int,
        task: str | None,
        lock: LockExpression,
    ) -> list[tuple[int, bool]]: ...
    def lock_and_claim(
        self,
        conn: Connection,
        queue: str,
        limit: int,
        offset: int,
        worker_id: str,
        lock: LockExpression,
    ) -> tuple[list[int], list[Job]] | None: ...
    def claim_ids(
        self,
        conn: Connection,
        ids: Sequence[int],
        worker_id: str,
        due_only: bool = True,
        unflushed: bool = False,
    ) -> list[Job]: ...


class ClaimStrategy(abc.ABC):
    name: ClassVar[str]
    #: True when the claim lives in the transaction that also runs the handlers (a row lock or
    #: SQLite's write lock): nothing is committed as 'running', and a crashed worker's
    #: transaction simply rolls back, leaving its jobs available. False when the claim is
    #: committed first and an external lock (advisory, lock server) marks the job as taken.
    claims_in_transaction: ClassVar[bool]
    #: True when claims go through ``dbqueue server``: enqueues then hint it that work is there.
    claims_through_lock_server: ClassVar[bool] = False

    def __init__(self, dialect: Dialect, settings: Settings | None = None) -> None:
        self.check_supported(dialect)
        self.dialect = dialect
        self.settings = settings or Settings()

    @classmethod
    def for_dialect(cls, dialect: Dialect | type[Dialect]) -> type[ClaimStrategy]:
        """The class that makes this strategy's claims on ``dialect``'s database (a strategy may
        claim differently where the database itself already serialises writers)."""
        return cls

    @classmethod
    @abc.abstractmethod
    def check_supported(cls, dialect: Dialect) -> None:
        """Raise StrategyNotSupportedError, with the reason, if ``dialect`` cannot do this."""

    @abc.abstractmethod
    def claim(
        self, conn: Connection, claims: ClaimStatements, queue: str, limit: int, worker_id: str
    ) -> list[Job]:
        """Claim up to ``limit`` runnable jobs of ``queue``.

        In-transaction strategies are called inside the open batch transaction; the others
        commit their claim before returning.
        """

    @abc.abstractmethod
    def claim_limited(
        self,
        conn: Connection,
        claims: ClaimStatements,
        queue: str,
        limit: int,
        worker_id: str,
        slots: int,
    ) -> list[Job] | None:
        """Claim from a queue at most ``slots`` jobs of which may run at once across all
        workers: first take one of its slots numbered below ``slots``, with this strategy's own
        kind of lock, held for as long as the claimed job's outcome is uncommitted, then claim
        at most as many jobs as the slots taken allow. None: every slot is taken (the caller
        goes on with its other queues, and idles as usual). Called like ``claim``; ``release``
        gives up the slot with the job's locks.
        """

    @abc.abstractmethod
    def claim_ids(
        self, conn: Connection, claims: ClaimStatements, ids: list[int], worker_id: str
    ) -> list[Job]:
        """Claim those of these jobs that still wait, whatever their run_at, made exclusive
        the way ``claim`` is (so a worker cannot take them too): eager mode runs a job by id
        when its enqueue commits. Same transaction rules as ``claim``."""

    @abc.abstractmethod
    def claim_task(
        self,
        conn: Connection,
        claims: ClaimStatements,
        queue: str,
        task: str,
        limit: int,
        worker_id: str,
        exclude: list[Job],
    ) -> list[Job]:
        """Claim up to ``limit`` more runnable jobs of one task of ``queue`` (a batch
        handler's gathering), besides ``exclude``, the jobs this worker thread already claimed.
        Same transaction rules as ``claim``."""

    #: Whether a worker may wait, holding its claim, for more jobs of a batch task. False where
    #: the claim holds the database's single write lock: the enqueues waited for would wait too.
    waits_holding_claims: ClassVar[bool] = True

    @property
    def releases_with_outcome(self) -> bool:
        """Whether the jobs' locks may go in the outcome's transaction, after its fenced
        UPDATEs, just before it commits (``release_jobs``): a database session's lock, whose
        release is then one statement more there instead of a transaction of its own. Safe:
        until the commit, the outcome's row locks make a rescue that takes the lock wait, then
        find the job no longer running."""
        return False

    def release_jobs(self, conn: Connection, claims: ClaimStatements, jobs: list[Job]) -> None:  # noqa: B027
        """Give up the jobs' own locks in the outcome's transaction (``releases_with_outcome``)."""

    def release(
        self,
        conn: Connection,
        claims: ClaimStatements,
        jobs: list[Job],
        jobs_released: bool = False,
    ) -> None:
        """Give up whatever external locks the claim took (after the batch committed);
        ``jobs_released``: the jobs' own locks already went with the outcome."""

    def release_abandoned(self, claims: ClaimStatements, jobs: list[Job], thread_id: int) -> None:  # noqa: B027
        """Give up the external locks a thread the watchdog abandoned took for ``jobs``."""

    def holds(self, conn: Connection, claims: ClaimStatements, jobs: list[Job]) -> bool:
        """Whether this worker still holds the claims of ``jobs``, asked just before their
        outcome commits. A row lock or a database session lock cannot be lost while the
        transaction lives; the lock server's can (it restarted, the connection dropped)."""
        return True

    def ask_holds(self, claims: ClaimStatements, jobs: list[Job]) -> Callable[[Connection], bool]:
        """``holds``, asked now (before the outcome's UPDATE) and answered by the call
        returned (just before the commit): a question to the lock server travels meanwhile."""
        return lambda conn: self.holds(conn, claims, jobs)

    @property
    def liveness_locks(self) -> LockBackend | None:
        """The locks that tell whether a ``running`` job's worker is alive (for rescue), and
        that keep two runs of a maintenance routine apart; None where the database has none."""
        return None

    def notifier(self, engine: Engine, names: TableNames) -> Notifier | None:
        """A push channel of the strategy's own (the lock server), else None: the database's."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the strategy holds (connections to a lock server)."""

    @property
    def attempt_increment(self) -> int:
        """An in-transaction claim counts the attempt when the outcome is written."""
        return 1 if self.claims_in_transaction else 0

    @property
    def claimed_status(self) -> str:
        """The status a claimed job has in the database while its handler runs."""
        return Status.AVAILABLE if self.claims_in_transaction else Status.RUNNING

    def fence(self, worker_id: str) -> Fence:
        """The fence of this strategy's claims by ``worker_id``: a committed claim's outcomes
        change only rows still running under that worker."""
        claimed_by = None if self.claims_in_transaction else worker_id
        return Fence(self.claimed_status, self.attempt_increment, worker_id, claimed_by)

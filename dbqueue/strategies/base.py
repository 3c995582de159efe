"""How a claim is made exclusive: the interface each strategy module implements."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from sqlalchemy.engine import Connection, Engine

from dbqueue.base.wakeup import Notifier
from dbqueue.config import Settings
from dbqueue.dialects import Dialect
from dbqueue.job import Job, Status
from dbqueue.schema.tables import TableNames
from dbqueue.strategies.locks import DatabaseLocks, LockBackend

if TYPE_CHECKING:
    from dbqueue.engine import QueueEngine


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
        self, conn: Connection, engine: QueueEngine, queue: str, limit: int, worker_id: str
    ) -> list[Job]:
        """Claim up to ``limit`` runnable jobs of ``queue``.

        In-transaction strategies are called inside the open batch transaction; the others
        commit their claim before returning.
        """

    @abc.abstractmethod
    def claim_limited(
        self,
        conn: Connection,
        engine: QueueEngine,
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
        self, conn: Connection, engine: QueueEngine, ids: list[int], worker_id: str
    ) -> list[Job]:
        """Claim those of these jobs that still wait, whatever their run_at, made exclusive
        the way ``claim`` is (so a worker cannot take them too): eager mode runs a job by id
        when its enqueue commits. Same transaction rules as ``claim``."""

    @abc.abstractmethod
    def claim_task(
        self,
        conn: Connection,
        engine: QueueEngine,
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

    def release_jobs(self, conn: Connection, engine: QueueEngine, jobs: list[Job]) -> None:  # noqa: B027
        """Give up the jobs' own locks in the outcome's transaction (``releases_with_outcome``)."""

    def release(
        self, conn: Connection, engine: QueueEngine, jobs: list[Job], jobs_released: bool = False
    ) -> None:
        """Give up whatever external locks the claim took (after the batch committed);
        ``jobs_released``: the jobs' own locks already went with the outcome."""

    def release_abandoned(self, engine: QueueEngine, jobs: list[Job], thread_id: int) -> None:  # noqa: B027
        """Give up the external locks a thread the watchdog abandoned took for ``jobs``."""

    def holds(self, conn: Connection, engine: QueueEngine, jobs: list[Job]) -> bool:
        """Whether this worker still holds the claims of ``jobs``, asked just before their
        outcome commits. A row lock or a database session lock cannot be lost while the
        transaction lives; the lock server's can (it restarted, the connection dropped)."""
        return True

    def ask_holds(self, engine: QueueEngine, jobs: list[Job]) -> Callable[[Connection], bool]:
        """``holds``, asked now (before the outcome's UPDATE) and answered by the call
        returned (just before the commit): a question to the lock server travels meanwhile."""
        return lambda conn: self.holds(conn, engine, jobs)

    @property
    def liveness_locks(self) -> LockBackend | None:
        """The locks that tell whether a ``running`` job's worker is alive (for rescue).

        In-transaction claims never commit ``running``; any such row comes from a lock-based
        worker, whose per-job lock the database's named locks can test where they exist.
        """
        if self.dialect.supports_named_locks:
            return DatabaseLocks(self.dialect)
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

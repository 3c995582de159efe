"""The lock server's named locks: the seed's client-server mode, on any database.

The claim is the advisory_lock strategy's (``LockClaimStrategy``): list runnable jobs, take a
lock per job — here on ``dbqueue server`` instead of in the database — then mark them
``running`` with a compare-and-set UPDATE (``status = 'available'``) and commit. It is the only
claim SingleStore can make exclusive: it has neither SKIP LOCKED nor named locks.

The lock lives on a different connection than the job's transaction, so unlike a database lock
it can be lost while the transaction goes on (the server restarted, the network dropped). The
worker therefore fences every outcome: the UPDATE that records it also requires ``status =
'running' AND worker_id = <this worker thread>``, and ``holds()`` checks the lock — no message
while the connection that took it is up, a question to the server after a reconnect
(``LockServerLocks.ask_holding``); only then does the transaction commit (see
``worker/executor.py``).

On a database that admits one writer at a time (SQLite) the claim is the database's own
(``SingleWriterLockServerStrategy``): the batch transaction holds the write lock from its claim
to its outcome's commit, which makes the claim exclusive by itself, and a crashed worker's claim
rolls back with its transaction. A lock per job on the server would add two round trips and a
second commit to every batch, and keep nothing safer. The server still pushes wake-ups, carries
enqueue hints and ``app.call``'s finishes, and holds the maintenance routines' locks.
"""

from __future__ import annotations

from sqlalchemy.engine import Connection, Engine

from dbqueue import lockserver
from dbqueue.base.wakeup import Notifier
from dbqueue.config import Settings
from dbqueue.dialects import Dialect
from dbqueue.job import Job
from dbqueue.lockserver import client as clients
from dbqueue.lockserver.locks import LockServerLocks
from dbqueue.lockserver.notifier import LockServerNotifier
from dbqueue.schema.tables import TableNames
from dbqueue.strategies.advisory_lock import LockClaimStrategy
from dbqueue.strategies.base import ClaimStatements, ClaimStrategy
from dbqueue.strategies.listed import ListedCandidates
from dbqueue.strategies.locks import job_lock_name
from dbqueue.strategies.sqlite import SQLiteStrategy

#: Lists tried by one claim before it lists and pages as other lock claims do.
LISTED_TRIES = 3


class ServerLink:
    """A strategy's connections to ``dbqueue server``: the one its locks are taken on, opened
    (and waited for) at once, and the notifier's, opened when asked."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.timeout = lockserver.message_timeout(settings)
        self.address = lockserver.lock_address(settings)
        self.notify_address = lockserver.notify_address(settings)
        self._clients: list[clients.LockServerClient] = []
        self.client = self.connect(self.address)
        try:
            # At start-up a server that cannot be reached, or refuses this client (wrong token,
            # other protocol version), is a configuration error, reported at once; a server
            # lost later is reconnected to, and claims wait for it.
            if not self.client.wait_connected(self.timeout):
                raise clients.LockServerUnavailableError(
                    f"cannot reach the lock server at {self.address}: {self.client.last_error} "
                    "(start `dbqueue server`, or fix --server / DBQUEUE_LOCK_SERVER / "
                    "SERVER_HOST and LOCK_SERVICE_PORT)"
                )
        except Exception:
            self.close()
            raise

    def connect(self, address: lockserver.Address) -> clients.LockServerClient:
        client = clients.connect(
            address, token=self.settings.lock_server_token, timeout=self.timeout
        )
        self._clients.append(client)
        return client

    def notifier(self) -> Notifier:
        return LockServerNotifier(self.connect(self.notify_address))

    def close(self) -> None:
        while self._clients:
            clients.disconnect(self._clients.pop())


class LockServerStrategy(LockClaimStrategy):
    name = "lock_server"
    claims_through_lock_server = True

    def __init__(self, dialect: Dialect, settings: Settings | None = None) -> None:
        self.link = ServerLink(settings or Settings())
        super().__init__(dialect, LockServerLocks(self.link.client), settings)
        self.listed = ListedCandidates()

    @classmethod
    def check_supported(cls, dialect: Dialect) -> None:
        """Every database: the server holds the locks, the database only the jobs."""

    @classmethod
    def for_dialect(cls, dialect: Dialect | type[Dialect]) -> type[ClaimStrategy]:
        return SingleWriterLockServerStrategy if dialect.single_writer else cls

    def claim(
        self, conn: Connection, claims: ClaimStatements, queue: str, limit: int, worker_id: str
    ) -> list[Job]:
        """Ids to try come from the process's list (``listed.py``), so that a claim is a lock
        request and one UPDATE, and only now and then a listing too. Should its ids keep being
        taken by other workers, the claim lists and pages as the other lock claims do."""
        for _ in range(LISTED_TRIES):
            jobs = self._claim_listed(conn, claims, queue, limit, worker_id)
            if jobs is None:
                return []
            if jobs:
                return jobs
        return super().claim(conn, claims, queue, limit, worker_id)

    def _claim_listed(
        self, conn: Connection, claims: ClaimStatements, queue: str, limit: int, worker_id: str
    ) -> list[Job] | None:
        """Lock ids from the list and mark them running: the jobs claimed; None when the queue
        has nothing runnable."""
        namespace = claims.namespace

        def list_ids(size: int) -> list[int]:
            with self._locking(conn, True):
                return claims.candidate_ids(conn, queue, size)

        ids = self.listed.take(queue, limit, self._window(worker_id), list_ids)
        if not ids:
            return None
        names = {job_id: job_lock_name(namespace, job_id) for job_id in ids}
        held: list[str] = []
        jobs: list[Job] = []
        try:
            locked = self._try_group(conn, ids, names, held)
            if locked:  # one UPDATE, committing on its own where the driver can, unflushed
                with self.dialect.one_statement_transaction(conn):
                    jobs = claims.claim_ids(conn, locked, worker_id, unflushed=True)
        except BaseException:
            self._let_go(conn, held)  # as in LockClaimStrategy._claim
            raise
        marked = {job.id for job in jobs}
        if len(marked) < len(locked):
            self.listed.forget(queue)
        self.locks.release(conn, [names[i] for i in locked if i not in marked])
        return jobs

    def notifier(self, engine: Engine, names: TableNames) -> Notifier:
        return self.link.notifier()

    def close(self) -> None:
        if isinstance(self.locks, LockServerLocks):
            self.locks.close()
        self.link.close()


class SingleWriterLockServerStrategy(SQLiteStrategy):
    """``lock_server`` on a database that admits one writer at a time: claims in the batch
    transaction, under the write lock (see the module's docstring); the server for the rest."""

    name = "lock_server"
    claims_through_lock_server = True

    def __init__(self, dialect: Dialect, settings: Settings | None = None) -> None:
        super().__init__(dialect, settings)
        self.link = ServerLink(self.settings)
        self.locks = LockServerLocks(self.link.client)

    @property
    def liveness_locks(self) -> LockServerLocks:
        """The maintenance routines' locks; and a ``running`` job left by a lock_server worker
        that committed its claim (an older dbqueue) is rescued once its lock is free."""
        return self.locks

    def notifier(self, engine: Engine, names: TableNames) -> Notifier:
        return self.link.notifier()

    def close(self) -> None:
        self.locks.close()
        self.link.close()

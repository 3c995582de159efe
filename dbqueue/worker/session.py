"""The Session a handler receives: inside the job's transaction, which only dbqueue ends."""

from __future__ import annotations

import contextlib
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session


class _FlushOnExit:
    """What ``with session.begin():`` does in a handler: flush on success, nothing else."""

    def __init__(self, session: JobSession) -> None:
        self.session = session

    def __enter__(self) -> JobSession:
        return self.session

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.session.flush()


class JobSession(Session):
    """An ORM Session joined to the transaction that holds the job's claim.

    Its first use opens a SAVEPOINT (SQLAlchemy's ``create_savepoint`` join mode), so a handler
    that never touches the database costs no round trip, and a failing one rolls back only its
    own writes — not the claim, nor other jobs of the same batch. The handler cannot end the
    job's transaction early: ``commit()`` and ``with session.begin():`` flush, and the writes
    commit together with the job's completion, or not at all.

    ``savepoint=False`` (databases without savepoints, SingleStore): the session joins the job's
    own transaction directly, and a failure is undone by rolling back that whole transaction,
    which the executor does.

    ``own_transaction=True`` (a job run outside its claim's transaction): no transaction of
    dbqueue's is open on the connection, so the session's are its own: ``commit()`` commits,
    and what is left uncommitted when the handler returns is committed just before the job's
    outcome (in a transaction of its own).
    """

    def __init__(
        self, connection: Connection, savepoint: bool = True, own_transaction: bool = False
    ) -> None:
        super().__init__(
            bind=connection,
            join_transaction_mode="create_savepoint" if savepoint else "rollback_only",
            expire_on_commit=False,
        )
        self._savepoint = savepoint or own_transaction
        self.own_transaction = own_transaction
        #: The tenant database session of the running job (``tenant_database=True``), ended
        #: with the job: committed by ``keep``, rolled back by ``discard``.
        self._tenant: Any = None
        #: A job of this batch used a tenant database: the batch ends after it.
        self.tenant_used = False

    def commit(self) -> None:
        if self.own_transaction:
            Session.commit(self)
        else:
            self.flush()

    def begin(self, nested: bool = False) -> Any:
        if nested or self.own_transaction:
            return super().begin(nested=nested)
        return _FlushOnExit(self)

    def close(self) -> None:
        """Ignored inside a handler; dbqueue closes the session when the job ends."""

    # ---- called by the worker ---------------------------------------------------------------
    # One JobSession serves every job of a batch in turn: after each job it is reset, so the
    # next job's first use opens a savepoint of its own. A handler that never touched it costs
    # nothing here (most of a no-op job's time would otherwise be spent right here).
    def _used(self) -> bool:
        # ``_new`` is the dict behind ``new``, which copies it into a set on every read.
        return self._transaction is not None or bool(self._new)

    def reusable(self) -> bool:
        """Whether the batch's next job may have this session: its last job left it unused
        (released or rolled back) and holding no tenant session."""
        return not self._used() and self._tenant is None

    def attach_tenant(self, tenant_session: Any) -> None:
        self._tenant, self.tenant_used = tenant_session, True

    def _end_tenant(self, ok: bool) -> None:
        tenant, self._tenant = self._tenant, None
        if tenant is not None:
            tenant.finish(ok)

    def keep(self) -> None:
        """The handler succeeded: commit its tenant session, if any (a failure there fails
        the job), then release its savepoint (its writes stay in the transaction)."""
        self._end_tenant(True)
        if self._used():
            Session.commit(self)
            Session.close(self)

    def discard(self) -> None:
        """The handler failed: roll back to its savepoint (without one, the executor rolls
        back the job's whole transaction); its tenant session rolls back."""
        with contextlib.suppress(Exception):  # a broken tenant connection committed nothing
            self._end_tenant(False)
        if not self._used():
            return
        try:
            if self._savepoint:
                Session.rollback(self)
            else:
                self.expunge_all()
        finally:
            Session.close(self)

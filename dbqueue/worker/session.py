"""The Session a handler receives: inside the job's transaction, which only dbqueue ends."""

from __future__ import annotations

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
    """

    def __init__(self, connection: Connection) -> None:
        super().__init__(
            bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False
        )

    def commit(self) -> None:
        self.flush()

    def begin(self, nested: bool = False) -> Any:
        if nested:
            return super().begin(nested=True)
        return _FlushOnExit(self)

    def close(self) -> None:
        """Ignored inside a handler; dbqueue closes the session when the job ends."""

    # ---- called by the worker ---------------------------------------------------------------
    def keep(self) -> None:
        """The handler succeeded: release its savepoint (its writes stay in the transaction)."""
        Session.commit(self)
        Session.close(self)

    def discard(self) -> None:
        """The handler failed: roll back to its savepoint."""
        try:
            Session.rollback(self)
        finally:
            Session.close(self)

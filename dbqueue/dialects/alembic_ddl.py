"""Alembic's DDL rules for a database it does not know by its SQLAlchemy dialect's name.

Alembic chooses how to alter tables by that name, and has no ``singlestoredb``: MySQL's rules
are SingleStore's. Whatever runs Alembic imports this module (dbqueue's migrations do), as an
application's own env.py may hand Alembic a connection before dbqueue has loaded the database's
module; this module needs Alembic, not the database's driver."""

from __future__ import annotations

from alembic.ddl.mysql import MySQLImpl


class SingleStoreImpl(MySQLImpl):
    """Alembic knows no ``singlestoredb`` dialect; MySQL's DDL rules are SingleStore's."""

    __dialect__ = "singlestoredb"

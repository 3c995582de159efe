"""The queue tables' migrations: Alembic revisions shipped in the package (``versions/``), run on
one version table per queue (``migrate.py``: ``dbqueue migrate``, ``app.migrate()``, the worker's
start-up check), and dbqueue inside an application's own Alembic project (``alembic.py``)."""

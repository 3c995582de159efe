"""`alembic upgrade head` from a checkout runs dbqueue's packaged migrations.

The revisions live in dbqueue/migrations/versions (alembic.ini points there), so this
environment and `dbqueue migrate` from an installed wheel apply exactly the same migrations.
Options: -x url=… (else DBQUEUE_URL, else the seed's DB_* variables, else sqlite:///dbqueue.db),
-x dialect=…, -x prefix=…, -x schema=…, -x jobs_table=…, -x subscriptions_table=….
"""

from alembic import context

from dbqueue.migrations.migrate import run_migrations

run_migrations(context)

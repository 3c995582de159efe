"""``python -m dbqueue.db_gen <schema> <queue>``: the seed's ``nsj_queue_lib.db_gen``.

The seed printed a PostgreSQL script for one queue: its table ``<schema>.<queue>``, the
subscriber table, indexes, the NOTIFY trigger. This prints dbqueue's migrations for the same
names, without connecting: the jobs table ``<schema>.<queue>``, ``<queue>_subscriber``, and
dbqueue's own ``<queue>_maintenance`` and ``<queue>_alembic`` (so ``dbqueue migrate`` later
upgrades what this script made). ``--dialect`` or ``--url`` prints another database's DDL.
It is a command-line entry point: the top layer, like ``dbqueue.cli``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dbqueue import dialects
from dbqueue.config import parse_url
from dbqueue.errors import ConfigurationError, DbqueueError
from dbqueue.migrations import migrate
from dbqueue.schema.tables import TableNames

USAGE = "python -m dbqueue.db_gen <schema> <queue> [--dialect NAME | --url URL]"
SUBSCRIBER_SUFFIX = "_subscriber"


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one ``Error:`` line and exit 1, like dbqueue's CLI."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigurationError(f"{message}; usage: {USAGE}")


def parser() -> argparse.ArgumentParser:
    found = _Parser(
        prog="python -m dbqueue.db_gen",
        usage=USAGE,
        description="Print the DDL of one queue's tables (the seed's db_gen), without connecting.",
    )
    found.add_argument("schema", help="database schema holding the tables (must exist)")
    found.add_argument(
        "queue",
        help="the queue table (the seed's <nome_fila>); subscriptions go in <queue>_subscriber",
    )
    found.add_argument("--dialect", help=f"{', '.join(dialects.DIALECT_NAMES)} (postgresql)")
    found.add_argument("--url", help="a database URL: only its kind is used (never connected)")
    return found


def table_names(schema: str, queue: str) -> TableNames:
    """The seed's names: the queue's table is ``<queue>``, its subscribers'
    ``<queue>_subscriber``."""
    return TableNames(jobs=queue, subscriptions=f"{queue}{SUBSCRIBER_SUFFIX}", schema=schema)


def offline_url(dialect: str | None, url: str | None) -> str:
    """A URL of the chosen database's kind: ``url`` (checked against ``dialect``), else the
    dialect's driver, PostgreSQL (the seed's database) by default."""
    if url is not None:
        return dialects.resolve_url(url, dialect, environ={})
    name = dialect or "postgresql"
    if name not in dialects.DIALECT_NAMES:
        raise ConfigurationError(
            f"unknown dialect {name!r}: choose one of {', '.join(dialects.DIALECT_NAMES)}"
        )
    return f"{dialects.class_for_name(name).url_driver}://"


def header(names: TableNames, url: str) -> str:
    """How the generated tables are named to dbqueue, as SQL comments."""
    database = dialects.class_for_url(parse_url(url)).name
    return "\n".join(
        [
            f"-- dbqueue tables for the queue {names.schema}.{names.jobs} ({database})",
            f"-- The schema {names.schema} must exist. Workers and clients find these tables with",
            f"--   DBQUEUE_SCHEMA={names.schema} QUEUE_TABLE={names.jobs} "
            f"QUEUE_SUBSCRIBER_TABLE={names.subscriptions}",
            f"-- or dbqueue.App(url, schema={names.schema!r}, jobs_table={names.jobs!r}, "
            f"subscriptions_table={names.subscriptions!r}).",
            "",
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        url = offline_url(args.dialect, args.url)
        names = table_names(args.schema, args.queue)
        sql = migrate.upgrade_sql(url, names)
    except DbqueueError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(header(names, url) + sql)
    return 0


if __name__ == "__main__":
    sys.exit(main())

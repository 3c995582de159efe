"""The options every command shares (database, table prefix, schema, --app, logging) and the App
a command runs on, built from them once; dbqueue's own errors become one line, not a traceback."""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import sqlalchemy as sa

from dbqueue.app.facade import App
from dbqueue.cli import logs
from dbqueue.cli.loading import load_app
from dbqueue.config import (
    DATABASE_VARIABLES,
    DEFAULT_SQLITE_FILE,
    DEFAULT_SQLITE_URL,
    env_first,
    parse_bool,
)
from dbqueue.dialects import resolve_url
from dbqueue.errors import ConfigurationError, DbqueueError

#: Where the chosen log format is kept in click's context, for commands that print to stderr.
LOG_FORMAT = "dbqueue.log_format"
#: ``click.Context.meta`` key: the --app given (None: none), for commands that check names.
APP_SPEC = "dbqueue.app_spec"
DIALECT_HELP = (
    "postgresql, mysql, singlestore or sqlite (with the DB_* variables, or to check --url)"
)


def given_app_spec() -> str | None:
    """The running command's --app, for messages that depend on whether one was given."""
    return click.get_current_context().meta.get(APP_SPEC)


def chosen_log_format() -> str | None:
    """The running command's --log-format: a JSON log line says what a text summary would."""
    return click.get_current_context().meta.get(LOG_FORMAT)


def _configure_logging(verbose: bool, log_format: str = "text") -> None:
    debug = verbose
    if not debug and os.environ.get("LOG_DEBUG"):
        debug = parse_bool(os.environ["LOG_DEBUG"], "LOG_DEBUG")
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        handlers=[logs.handler(log_format, sys.stderr)],
    )
    if log_format == "json":
        logging.captureWarnings(True)  # a warning's lines become one record too
    if debug:
        logging.getLogger("sqlalchemy.engine").setLevel(logging.WARNING)
        # urllib3 logs each webhook request line, query string (and any token in it) included.
        logging.getLogger("urllib3").setLevel(logging.INFO)


def database_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--url, --dialect, --table-prefix, --schema, --app, -v and --log-format, shared by
    every command."""
    options = [
        click.option("--url", envvar="DBQUEUE_URL", help="Database URL (env DBQUEUE_URL)."),
        click.option("--dialect", envvar="DBQUEUE_DIALECT", help=DIALECT_HELP),
        click.option(
            "--table-prefix", envvar="DBQUEUE_TABLE_PREFIX", help="Queue table prefix (dbqueue_)."
        ),
        click.option("--schema", envvar="DBQUEUE_SCHEMA", help="Database schema of the tables."),
        click.option(
            "--app", "app_spec", envvar="DBQUEUE_APP", help="module:attribute of your dbqueue.App."
        ),
        click.option("-v", "--verbose", is_flag=True, help="Debug logging (env LOG_DEBUG)."),
        click.option(
            "--log-format",
            type=click.Choice(logs.LOG_FORMATS),
            default="text",
            show_default=True,
            envvar="DBQUEUE_LOG_FORMAT",
            help="json: one JSON object per log line (env DBQUEUE_LOG_FORMAT).",
        ),
    ]
    for option in reversed(options):
        command = option(command)

    @functools.wraps(command)
    def wrapper(
        url: str | None,
        dialect: str | None,
        table_prefix: str | None,
        schema: str | None,
        app_spec: str | None,
        verbose: bool,
        log_format: str,
        **kwargs: Any,
    ) -> Any:
        _configure_logging(verbose, log_format)
        click.get_current_context().meta[LOG_FORMAT] = log_format
        click.get_current_context().meta[APP_SPEC] = app_spec
        with OneLineErrors():
            app = build_app(url, dialect, table_prefix, schema, app_spec, verbose)
            default = default_database(app, url)
            if default is not None:
                creates = getattr(command, "creates_database", None)
                use_default_database(default, creates is not None and creates(kwargs))
            return command(app=app, **kwargs)

    return wrapper


def creates_database(when: Callable[[dict[str, Any]], bool]) -> Callable[..., Any]:
    """Mark a command that may create the default SQLite file (``when`` its options say so):
    every other command refuses a default file that does not exist instead of creating it."""

    def mark(command: Callable[..., Any]) -> Callable[..., Any]:
        command.creates_database = when  # type: ignore[attr-defined]
        return command

    return mark


def default_database(app: App, url: str | None) -> Path | None:
    """The default database's file, when nothing named a database: no --url, no DBQUEUE_URL
    or DB_* variables, no URL in the --app's App."""
    if url or env_first(os.environ, *DATABASE_VARIABLES) or app.url != DEFAULT_SQLITE_URL:
        return None
    return Path(DEFAULT_SQLITE_FILE).resolve()


def use_default_database(path: Path, creates: bool) -> None:
    """Say which database a command uses and why; refuse to create it by accident."""
    why = (
        f"the database is the default, {DEFAULT_SQLITE_URL} ({path}), as no --url, "
        "DBQUEUE_URL or DB_* variable names one"
    )
    if not path.exists() and not creates:
        raise ConfigurationError(
            f"{why}; it does not exist: pass --url or set DBQUEUE_URL to your database, or "
            "run `dbqueue migrate` to create the default one here"
        )
    click.echo(f"dbqueue: {why}", err=True)


def build_app(
    url: str | None,
    dialect: str | None,
    table_prefix: str | None,
    schema: str | None,
    app_spec: str | None,
    verbose: bool = False,
) -> App:
    resolved = resolve_url(url, dialect)  # validates --dialect and the URL early
    app = load_app(app_spec, verbose)
    if app is None:
        return App(resolved, table_prefix=table_prefix, schema=schema)
    if url or dialect or table_prefix or schema:
        return app.reconfigured(url=resolved, table_prefix=table_prefix, schema=schema)
    return app


class OneLineErrors:
    """dbqueue's own errors and unreachable databases print one line, not a traceback."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, DbqueueError):
            raise click.ClickException(str(exc)) from None
        if isinstance(exc, sa.exc.OperationalError):
            first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            raise click.ClickException(
                f"database error: {first} (check --url / DBQUEUE_URL, that the server is "
                "running, and the credentials)"
            ) from None
        return False

"""Running ``dbqueue`` commands in the test process (click's runner): a process each takes
seconds on a loaded machine, and a suite that runs every command runs hundreds.

A command that raises anything but click's own exit shows as ``Outcome.exception``: for a
user, that is a traceback.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from click.testing import CliRunner

import dbqueue
from dbqueue.cli.main import cli

from .backends import Backend, drop_queue_tables


@dataclass
class Outcome:
    exit_code: int
    stdout: str
    stderr: str
    exception: BaseException | None = None

    @property
    def returncode(self) -> int:
        """As a finished process's: tests read either the same way."""
        return self.exit_code


def invoke(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> Outcome:
    """``dbqueue ARGS`` in this process, with the environment a user's shell would give it and
    logging bound to the captured stderr (as the real command's is)."""
    clean: dict[str, str | None] = {
        k: None
        for k in os.environ
        if k.startswith(("DBQUEUE_", "DB_", "DATABASE_")) and not k.startswith("DBQUEUE_TEST_")
    }
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()
    old_cwd = os.getcwd()
    os.chdir(cwd)
    sys.path.insert(0, str(cwd))
    try:
        result = CliRunner().invoke(cli, args, env={**clean, **(env or {})})
    finally:
        sys.path.remove(str(cwd))
        os.chdir(old_cwd)
        root.handlers[:] = saved
        gc.collect()  # the command's engine and its pooled connections: a process would exit
    exception = result.exception
    if isinstance(exception, SystemExit):
        exception = None
    return Outcome(result.exit_code, result.stdout, result.stderr, exception)


def assert_one_line_error(result: Any, *fragments: str) -> str:
    """``result`` (an Outcome, or a finished ``dbqueue`` process) failed with exit code 1 and
    one line, ``Error: …``, holding each of ``fragments``; it returns that line."""
    code = result.exit_code if isinstance(result, Outcome) else result.returncode
    assert getattr(result, "exception", None) is None, (result.stderr, result.exception)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert code == 1, (code, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@contextlib.contextmanager
def unmigrated_prefix(database: Backend) -> Iterator[str]:
    """A table prefix with no tables behind it; whatever a command creates there is dropped."""
    prefix = f"{database.prefix}n{secrets.token_hex(3)}_"
    try:
        yield prefix
    finally:
        engine = dbqueue.App(database.url).create_engine()
        try:
            drop_queue_tables(engine, prefix)
        finally:
            engine.dispose()

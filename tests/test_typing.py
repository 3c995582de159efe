"""dbqueue ships type information: a user's code type-checks against the public API with
``mypy --strict``, and mypy catches mistakes in calls to it.

mypy runs as a subprocess, with the checkout on PYTHONPATH the way an installed package sits
on ``sys.path``: it then treats dbqueue as a third-party package, which it reads only because
of ``py.typed`` and whose own internals it does not report on (as for a user). That the wheel
ships ``py.typed``: tests/test_packaging.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import dbqueue

ROOT = Path(__file__).resolve().parents[1]
CHECKS = Path(__file__).resolve().parent / "typecheck"
MARKER = re.compile(r"#\s*error:\s*\[([a-z-]+(?:,\s*[a-z-]+)*)\]")
REPORTED = re.compile(r":(\d+): error: .*\[([a-z-]+)\]$")


@pytest.fixture(scope="module")
def mypy(tmp_path_factory: pytest.TempPathFactory):
    """``mypy(file)`` → the finished ``mypy --strict`` run (one cache for the module)."""
    pytest.importorskip("mypy")
    workdir = tmp_path_factory.mktemp("mypy")

    def run(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(workdir / "cache"),
             "--no-color-output", "--no-error-summary", str(path)],
            cwd=workdir,  # not the checkout: dbqueue must come through PYTHONPATH alone
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=600,
        )  # fmt: skip

    return run


def test_user_code_passes_mypy_strict(mypy) -> None:
    done = mypy(CHECKS / "user_code.py")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_reports_each_mistake_in_calls_to_dbqueue(mypy) -> None:
    path = CHECKS / "user_errors.py"
    expected = {
        (number, code.strip())
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if (found := MARKER.search(line))
        for code in found.group(1).split(",")
    }
    done = mypy(path)
    reported = {
        (int(found.group(1)), found.group(2))
        for line in done.stdout.splitlines()
        if (found := REPORTED.search(line))
    }
    assert done.returncode == 1, done.stdout + done.stderr
    assert len(expected) >= 6
    assert reported == expected, done.stdout


def test_job_declares_a_type_for_every_slot() -> None:
    """Job sets its attributes from ``__slots__`` at run time, which a type checker cannot see:
    each slot needs its annotation in the class body, or user code reading it fails ``--strict``."""
    assert set(typing.get_type_hints(dbqueue.Job)) - {"ITEM_NAMES", "ITEM_ALIASES"} == set(
        dbqueue.Job.__slots__
    )

"""Report lines that tests write for the end of the run, across pytest-xdist worker processes.

Worker processes cannot add to the main process's terminal summary, so they write lines to
files in pytest's cache directory; the main process clears them at the start of a run and prints
them at its end (tests/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest


def report_dir(config: pytest.Config, name: str) -> Path:
    return Path(config.cache.mkdir(f"dbqueue-{name}"))  # type: ignore[union-attr]


def is_main_process(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def clear(config: pytest.Config, name: str) -> None:
    for old in report_dir(config, name).glob("*.txt"):
        old.unlink()


def lines(config: pytest.Config, name: str) -> list[str]:
    found: list[str] = []
    for part in sorted(report_dir(config, name).glob("*.txt")):
        found += part.read_text().splitlines()
    return found

"""Chaos suite fixtures: private database servers (restartable), and the closing report."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


REPORT = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def private_servers() -> Iterator[dict[str, object]]:
    """database name → its private server (or why there is none), filled on first use."""
    servers: dict[str, object] = {}
    yield servers
    for server in servers.values():
        if not isinstance(server, str):
            server.destroy()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def chaos_report(request: pytest.FixtureRequest) -> list[str]:
    return request.config.stash.setdefault(REPORT, [])


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    lines = config.stash.get(REPORT, [])
    if lines:
        terminalreporter.section("dbqueue chaos")
        for line in lines:
            terminalreporter.write_line(line)

"""Chaos suite fixtures: private database servers (restartable), and the closing report."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import reporting  # noqa: E402


@pytest.fixture(scope="session")
def private_servers() -> Iterator[dict[str, object]]:
    """database name → its private server (or why there is none), filled on first use."""
    servers: dict[str, object] = {}
    yield servers
    for server in servers.values():
        if not isinstance(server, str):
            server.destroy()  # type: ignore[attr-defined]


class ChaosReport:
    """Lines for the closing "dbqueue chaos" section (see support/reporting.py)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, line: str) -> None:
        with self.path.open("a") as report:
            report.write(line + "\n")

    def __repr__(self) -> str:
        return self.path.read_text() if self.path.exists() else "(empty)"


@pytest.fixture(scope="session")
def chaos_report(request: pytest.FixtureRequest) -> ChaosReport:
    worker = getattr(request.config, "workerinput", {}).get("workerid", "main")
    return ChaosReport(reporting.report_dir(request.config, "chaos") / f"{worker}.txt")

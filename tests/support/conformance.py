"""The checklist of a conformance suite: which test exercises each member of an interface.

A test says what it covers with ``@checklist.covers("member", …)``; a member a test elsewhere
covers is named with ``checklist.elsewhere``. The suite's checklist test then fails naming every
public member of the interface (method, property, capability flag, class attribute) that no
test covers, so a member added to the interface without a conformance test fails the run.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

Test = TypeVar("Test", bound=Callable[..., Any])
TESTS = Path(__file__).resolve().parents[1]


class Checklist:
    def __init__(self, interface: type) -> None:
        self.interface = interface
        #: member → the names of the tests of this module that exercise it.
        self.covered: dict[str, list[str]] = {}
        #: member → ``path::test`` of a test in another module (relative to tests/).
        self.outside: dict[str, str] = {}

    def covers(self, *members: str) -> Callable[[Test], Test]:
        """Mark a test as exercising these members of the interface."""

        def mark(test: Test) -> Test:
            for member in members:
                self.covered.setdefault(member, []).append(test.__name__)
            return test

        return mark

    def elsewhere(self, member: str, test: str) -> None:
        """``member`` is exercised by ``test`` (``path/to/test_file.py::test_name``)."""
        self.outside[member] = test

    def members(self) -> set[str]:
        """The interface's public members: its own attributes and annotated class variables."""
        own = set(vars(self.interface)) | set(getattr(self.interface, "__annotations__", {}))
        return {name for name in own if not name.startswith("_")}

    def problems(self, module_globals: dict[str, Any]) -> list[str]:
        """Every member without a test, every test named that does not exist, and every
        member named that the interface does not have."""
        found = []
        members = self.members()
        for member in sorted(members - set(self.covered) - set(self.outside)):
            found.append(f"{self.interface.__name__}.{member} has no conformance test")
        for member in sorted((set(self.covered) | set(self.outside)) - members):
            found.append(
                f"{member} is checked off but {self.interface.__name__} has no such member"
            )
        for member, tests in sorted(self.covered.items()):
            found += [f"{member}: no test {name}" for name in tests if name not in module_globals]
        for member, where in sorted(self.outside.items()):
            if not _exists(where):
                found.append(f"{member}: no test {where}")
        return found


def _exists(where: str) -> bool:
    """Whether ``path::test`` names a test function defined in that file."""
    path, _, name = where.partition("::")
    file = TESTS / path
    if not file.is_file():
        return False
    tree = ast.parse(file.read_text())
    return any(isinstance(node, ast.FunctionDef) and node.name == name for node in tree.body)

"""The size limits of the style guide hold: no class over 400 lines, no function over 60.

Counted with ``ast`` from a definition's first line (its decorators not included) to its last,
docstring and comments inside it included, over the package and the benchmarks: the code a
reader has to take in whole. A nested function counts on its own and inside its parent. The
first test proves the counter finds exactly a planted oversized class and function.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 60


def oversized(source: str, where: str) -> list[str]:
    """``where:line name (n lines)`` for each class or function of ``source`` over its limit."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            limit = MAX_CLASS_LINES
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            limit = MAX_FUNCTION_LINES
        else:
            continue
        assert node.end_lineno is not None
        lines = node.end_lineno - node.lineno + 1
        if lines > limit:
            found.append(f"{where}:{node.lineno} {node.name} ({lines} lines, at most {limit})")
    return found


def test_the_counter_reports_exactly_the_oversized_definitions() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    source = textwrap.dedent(
        """
        def fits():
            return 1

        """
    )
    limit = "\n".join(f"    y{i} = {i}" for i in range(58))
    source += f"def exactly_at_the_limit():\n{limit}\n    return y0\n\n"
    source += f"def too_long():\n{body}\n    return x0\n\n"
    source += "class Big:\n" + "\n".join(
        f"    def m{i}(self):\n        return {i}\n" for i in range(134)
    )
    found = oversized(source, "planted.py")
    assert [entry.split(" (")[0] for entry in found] == [
        "planted.py:66 too_long",
        "planted.py:129 Big",
    ], found


def test_package_and_benchmarks_keep_the_size_limits() -> None:
    found = []
    for folder in ("dbqueue", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += oversized(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not found, "split these (STYLE: classes ≤ 400 lines, functions ≤ 60):\n" + "\n".join(
        found
    )

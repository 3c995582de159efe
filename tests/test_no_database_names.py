"""The contract suite asks capabilities, never names: a test that branched on "postgresql" or
"lock_server" would silently skip a new database or strategy that has the same capability (or
run where it lacks it). Names live in the registry of backends only (support/backends.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from support.backends import BACKENDS

from dbqueue import dialects, strategies

CONTRACT = Path(__file__).parent / "contract"

#: Every name a test could pick a database or a strategy by.
NAMES = frozenset(
    {
        *dialects.DIALECT_NAMES,
        *(name for cls in dialects.DIALECT_CLASSES for name in cls.sqlalchemy_names),
        *(name for cls in dialects.DIALECT_CLASSES for name in cls.url_aliases),
        *(spec.database for spec in BACKENDS.values()),
        *strategies.STRATEGY_NAMES,
        *(spec.strategy for spec in BACKENDS.values()),
    }
)
#: Attributes holding a backend's database or strategy name.
NAMED_ATTRIBUTES = {"database", "strategy"}


def _is_name_attribute(node: ast.AST) -> bool:
    """``x.database`` / ``x.strategy`` (not a URL's ``url.database``, the database it opens)
    or ``dialect.name`` / ``x.dialect.name``."""
    if not isinstance(node, ast.Attribute):
        return False
    owner_name = _name_of(node.value)
    if node.attr in NAMED_ATTRIBUTES:
        return owner_name not in ("url", "make_url")
    return node.attr == "name" and owner_name == "dialect"


def _name_of(node: ast.AST) -> str | None:
    """``x`` of ``x``, ``a.x`` or ``a.x(…)``."""
    if isinstance(node, ast.Call):
        node = node.func
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)


def findings(source: str, filename: str = "<source>") -> list[str]:
    """Each place in ``source`` that names a database or strategy: ``file:line: what``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES:
            found.append(f"{filename}:{node.lineno}: the name {node.value!r}")
        elif isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                if _is_name_attribute(operand):
                    text = ast.unparse(node)
                    found.append(f"{filename}:{node.lineno}: a comparison with a name: {text}")
                    break
    return found


PLANTED = """
def test_planted(backend, database, engine, conn, app, url):
    if backend.database == "sqlite":
        pass
    if database.strategy in ("skip_locked",):
        pass
    if engine.dialect.name != other:
        pass
    if conn.dialect.name == wanted:
        pass
    assert url.database == make_url(app.url).database  # a URL's database file: allowed
    request.getfixturevalue("postgresql")
    pytest.mark.parametrize("x", ["mariadb", "lock_server"])
"""


def test_the_scan_finds_every_planted_name() -> None:
    found = findings(PLANTED)
    text = "\n".join(found)
    assert "'sqlite'" in text and "'skip_locked'" in text and "'postgresql'" in text, text
    assert "'mariadb'" in text and "'lock_server'" in text, text
    compared = [line for line in found if "comparison" in line]
    assert [line.split(":")[1] for line in compared] == ["3", "5", "7", "9"], text
    assert not any(":11:" in line for line in found), text  # url.database is a file, not a name


def test_the_contract_suite_names_no_database_and_no_strategy() -> None:
    files = sorted(CONTRACT.glob("*.py"))
    assert files, f"no test files in {CONTRACT}"
    found = [line for path in files for line in findings(path.read_text(), path.name)]
    assert found == [], "ask a capability (support/backends.py) instead:\n" + "\n".join(found)

"""The catalog of database operations holds: every statement the engine runs is built in
dbqueue/engine/catalog.py, named by its table then what it does, described in one line, and
used; the rest of the engine and pub/sub build no SQL of their own.

Read with ``ast``: the first test proves the scanner finds a planted statement.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from dbqueue.engine import catalog

PACKAGE = Path(__file__).resolve().parents[1] / "dbqueue"
#: Where the engine's statements may be built: the catalog, and nowhere else in these folders.
SCANNED = ("engine", "pubsub")
#: SQLAlchemy constructors and the dialects' statement builders.
BUILDERS = {"select", "insert", "update", "delete", "text"}
DIALECT_BUILDERS = {"insert_unless_present", "insert_or_count", "add_to_counter", "columnar_insert"}
TABLES = ("jobs", "keys", "unique", "cancels", "periodic", "slots", "workers", "maintenance")
#: Builders named for what they read rather than a table.
UNTABLED = {"runnable", "clock", "subscriptions"}


def statements_built(source: str) -> list[str]:
    """``line: call`` for each SQL statement ``source`` constructs itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        name = node.func.attr
        if isinstance(owner, ast.Name) and owner.id == "sa" and name in BUILDERS:
            found.append(f"{node.lineno}: sa.{name}")
        elif name in DIALECT_BUILDERS or name == "with_for_update":
            found.append(f"{node.lineno}: .{name}")
    return found


def test_the_scanner_finds_a_planted_statement() -> None:
    source = "import sqlalchemy as sa\n\ndef f(t, d):\n    return d.insert_or_count(t, 'n')\n"
    source += "\ndef g(t):\n    return sa.select(t.c.id).with_for_update()\n"
    assert statements_built(source) == [
        "4: .insert_or_count",
        "7: .with_for_update",
        "7: sa.select",
    ]


def test_only_the_catalog_builds_statements() -> None:
    found = []
    for folder in SCANNED:
        for path in sorted((PACKAGE / folder).glob("*.py")):
            if path.name == "catalog.py":
                continue
            found += [
                f"{path.relative_to(PACKAGE)}:{where}"
                for where in statements_built(path.read_text())
            ]
    assert not found, "build these in dbqueue/engine/catalog.py:\n" + "\n".join(found)


def _builders() -> dict[str, object]:
    return {
        name: value
        for name, value in vars(catalog).items()
        if inspect.isfunction(value)
        and value.__module__ == catalog.__name__
        and not name.startswith("_")
    }


def test_every_builder_is_named_by_its_table_and_described_in_one_line() -> None:
    builders = _builders()
    assert len(builders) > 60, sorted(builders)
    for name, build in builders.items():
        if name in ("id_names", "result_names"):
            continue
        head = name.split("_", 1)[0]
        assert head in TABLES or head in UNTABLED, f"{name}: name it <table>_<what it does>"
        doc = inspect.getdoc(build)
        assert doc and doc.split("\n\n")[0].strip(), f"{name} has no description"


def test_every_builder_is_used() -> None:
    sources = "\n".join(
        path.read_text() for path in PACKAGE.rglob("*.py") if path.name != "catalog.py"
    )
    unused = [
        name for name in _builders() if f"catalog.{name}" not in sources and name not in sources
    ]
    assert not unused, f"catalog entries nothing runs: {unused}"

"""The package's layering holds: no import cycle, no import up the layer order, no module left out.

Every module's imports under dbqueue/ are read with ``ast``: module level and function level
alike, and those inside ``if TYPE_CHECKING:`` too (a type a module names is a dependency a reader
follows, even if it never runs). A module may import modules of its own layer or of any layer
below it; a package's ``__init__`` may import its own submodules. The test fails on

1. any import cycle (a strongly connected component of more than one module);
2. any import that goes up the layer order below;
3. any module that no entry of the layer order covers, so that a new module is placed deliberately.

The checker is a handful of functions that take a package directory; the first tests build small
fake packages with planted defects and prove it reports exactly those, the last one runs it on
dbqueue/.
"""

from __future__ import annotations

import ast
import textwrap

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
from collections import deque
from pathlib import Path

import pytest

# The layer order, top to bottom: pyproject.toml's [tool.dbqueue.layers], the one place it is
# written (see the comment there for how a module finds its layer).
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
LAYERS: dict[str, tuple[str, ...]] = {
    layer: tuple(entries)
    for layer, entries in tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["dbqueue"][
        "layers"
    ].items()
}

PACKAGE = Path(__file__).resolve().parents[1] / "dbqueue"

Layers = dict[str, tuple[str, ...]]
# importer → imported → the line numbers of the import statements (in the importer's file).
Graph = dict[str, dict[str, list[int]]]


# --- the checker -------------------------------------------------------------------------------


def discover_modules(package_dir: Path) -> dict[str, Path | None]:
    """Dotted module name → its file, for every .py file under the package (a package is named by
    its __init__.py). Folders without __init__.py that hold .py files are namespace packages:
    modules without a file (so that ``import pkg.migrations`` resolves to them)."""
    package_dir = Path(package_dir)
    root = package_dir.name
    modules: dict[str, Path | None] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir).with_suffix("").parts
        if any(part == "__pycache__" or part.startswith(".") for part in parts):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join((root, *parts))] = path
        for depth in range(len(parts)):  # every enclosing folder is a (maybe namespace) package
            modules.setdefault(".".join((root, *parts[:depth])), None)
    return modules


def _all_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, under ``if TYPE_CHECKING:`` or not."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def _existing(name: str, modules: dict[str, Path | None]) -> str | None:
    """The module ``name`` refers to: itself, or its longest prefix that is a module (``import
    pkg.mod.Class`` is not valid Python, but ``pkg.mod.attr`` in a from-import base is trimmed
    the same way). None when it is not inside the package."""
    while name:
        if name in modules:
            return name
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return None


def _imported_modules(
    importer: str, node: ast.Import | ast.ImportFrom, modules: dict[str, Path | None]
) -> list[str]:
    """The package's modules one import statement depends on (modules outside it are dropped)."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        if node.level:
            is_package = modules[importer] is not None and modules[importer].name == "__init__.py"
            base = importer.split(".")
            keep = len(base) - node.level + (1 if is_package else 0)
            if keep < 1:  # beyond the top-level package: not ours to judge
                return []
            base_name = ".".join(base[:keep] + ([node.module] if node.module else []))
        else:
            base_name = node.module or ""
        # `from pkg import name`: the submodule pkg.name if there is one, else pkg (an attribute).
        targets = [
            f"{base_name}.{alias.name}" if f"{base_name}.{alias.name}" in modules else base_name
            for alias in node.names
        ]
    resolved = (_existing(target, modules) for target in targets)
    return [module for module in resolved if module is not None]


def import_graph(package_dir: Path) -> Graph:
    """importer → imported module → line numbers, for every import between the package's modules
    (a module importing itself is left out)."""
    modules = discover_modules(package_dir)
    graph: Graph = {module: {} for module in modules}
    for importer, path in modules.items():
        if path is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in sorted(_all_imports(tree), key=lambda node: node.lineno):
            for imported in _imported_modules(importer, node, modules):
                if imported != importer:
                    graph[importer].setdefault(imported, []).append(node.lineno)
    return graph


def find_cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.get(module, {}):
            if imported not in index:
                connect(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return sorted(components)


def _example_cycle(graph: Graph, component: list[str]) -> list[str]:
    """A shortest import path from the component's first module back to itself."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for imported in sorted(graph.get(module, {})):
            if imported == start:
                path = [module]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if imported in members and imported not in previous:
                previous[imported] = module
                queue.append(imported)
    return [*component, start]  # unreachable for a real component


def layer_of(module: str, layers: Layers, root: str) -> str | None:
    """The layer of the longest entry covering ``module`` (the root entry covers only itself)."""
    best_layer, best_length = None, -1
    for layer, entries in layers.items():
        for entry in entries:
            covers = module == entry or (entry != root and module.startswith(entry + "."))
            if covers and len(entry) > best_length:
                best_layer, best_length = layer, len(entry)
    return best_layer


def upward_imports(graph: Graph, layers: Layers, root: str) -> list[tuple[str, str, str, str]]:
    """(importer, imported, importer's layer, imported's layer) for each import that goes up.
    A package importing its own submodules is not judged; unassigned modules are reported apart."""
    rank = {layer: position for position, layer in enumerate(layers)}  # 0 is the top
    found = []
    for importer in sorted(graph):
        importer_layer = layer_of(importer, layers, root)
        for imported in sorted(graph[importer]):
            imported_layer = layer_of(imported, layers, root)
            if importer_layer is None or imported_layer is None:
                continue
            if imported.startswith(importer + "."):
                continue
            if rank[imported_layer] < rank[importer_layer]:
                found.append((importer, imported, importer_layer, imported_layer))
    return found


def unassigned_modules(package_dir: Path, layers: Layers) -> list[str]:
    root = Path(package_dir).name
    return [m for m in sorted(discover_modules(package_dir)) if layer_of(m, layers, root) is None]


def check_package(package_dir: Path, layers: Layers) -> list[str]:
    """Every violation, one line each: cycles, then upward imports, then unassigned modules."""
    package_dir = Path(package_dir)
    root = package_dir.name
    modules = discover_modules(package_dir)
    graph = import_graph(package_dir)

    def where(importer: str, imported: str) -> str:
        path = modules[importer]
        shown = path.relative_to(package_dir.parent).as_posix() if path else importer
        return f"{shown}:" + ",".join(str(line) for line in sorted(set(graph[importer][imported])))

    lines = []
    for component in find_cycles(graph):
        path = _example_cycle(graph, component)
        lines.append(
            f"import cycle between {len(component)} modules: {', '.join(component)}"
            f"  # e.g. {' -> '.join(path)}"
        )
    for importer, imported, importer_layer, imported_layer in upward_imports(graph, layers, root):
        lines.append(
            f"{importer} -> {imported} "
            f"(layer {importer_layer} imports layer {imported_layer} above it)"
            f"  # {where(importer, imported)}"
        )
    for module in unassigned_modules(package_dir, layers):
        path = modules[module]
        shown = path.relative_to(package_dir.parent).as_posix() if path else "namespace package"
        lines.append(f"{module} is not assigned to a layer  # {shown}: add it to LAYERS")
    return lines


# --- the checker catches what it claims (fake packages) ----------------------------------------


def make_package(tmp_path: Path, files: dict[str, str], name: str = "fakepkg") -> Path:
    """A package ``name`` under tmp_path with the given files (path relative to it → source)."""
    package_dir = tmp_path / name
    for relative, source in files.items():
        path = package_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")
    return package_dir


FAKE_LAYERS: Layers = {
    "top": ("fakepkg", "fakepkg.cli"),
    "mid": ("fakepkg.a", "fakepkg.b", "fakepkg.svc", "fakepkg.sub.serve"),
    "low": ("fakepkg.base", "fakepkg.sub"),
}


def test_checker_finds_a_cycle_made_by_a_function_level_import(tmp_path: Path) -> None:
    package = make_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from . import b\n",
            "b.py": """
                import os

                def later():
                    from .a import something  # runs only when called: still a dependency
                    return os, something
            """,
            "svc.py": "from fakepkg import a\n",  # imports into the cycle, is not part of it
        },
    )
    graph = import_graph(package)
    assert graph["fakepkg.a"] == {"fakepkg.b": [1]}
    assert graph["fakepkg.b"] == {"fakepkg.a": [5]}
    assert find_cycles(graph) == [["fakepkg.a", "fakepkg.b"]]
    assert check_package(package, FAKE_LAYERS) == [
        "import cycle between 2 modules: fakepkg.a, fakepkg.b"
        "  # e.g. fakepkg.a -> fakepkg.b -> fakepkg.a"
    ]


def test_checker_reports_an_upward_import(tmp_path: Path) -> None:
    package = make_package(
        tmp_path,
        {
            "__init__.py": "from .svc import run\n",  # top → mid: down, fine
            "svc.py": "from . import a\n\ndef run():\n    pass\n",  # mid → mid: fine
            "a.py": "",
            "b.py": "from .base import helper\n",  # mid → low: fine
            "base.py": """
                def helper():
                    from fakepkg.svc import run  # low → mid: up
                    return run
            """,
        },
    )
    assert upward_imports(import_graph(package), FAKE_LAYERS, "fakepkg") == [
        ("fakepkg.base", "fakepkg.svc", "low", "mid")
    ]
    assert check_package(package, FAKE_LAYERS) == [
        "fakepkg.base -> fakepkg.svc (layer low imports layer mid above it)  # fakepkg/base.py:3",
    ]


def test_imports_under_type_checking_count(tmp_path: Path) -> None:
    package = make_package(
        tmp_path,
        {
            "__init__.py": "",
            "svc.py": "import typing\nif typing.TYPE_CHECKING:\n    from . import base\n",
            "cli.py": "",
            "base.py": """
                import typing
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from .svc import Service
                    from . import cli

                if typing.TYPE_CHECKING:
                    import fakepkg.cli

                def annotate(service: "Service") -> None:
                    if TYPE_CHECKING:
                        from fakepkg import svc
                    else:
                        from . import svc
            """,
        },
    )
    assert import_graph(package)["fakepkg.base"] == {
        "fakepkg.svc": [6, 14, 16],
        "fakepkg.cli": [7, 10],
    }
    assert check_package(package, FAKE_LAYERS) == [
        "import cycle between 2 modules: fakepkg.base, fakepkg.svc"
        "  # e.g. fakepkg.base -> fakepkg.svc -> fakepkg.base",
        "fakepkg.base -> fakepkg.cli (layer low imports layer top above it)"
        "  # fakepkg/base.py:7,10",
        "fakepkg.base -> fakepkg.svc (layer low imports layer mid above it)"
        "  # fakepkg/base.py:6,14,16",
    ]


def test_relative_imports_resolve_to_submodules_or_to_the_package(tmp_path: Path) -> None:
    package = make_package(
        tmp_path,
        {
            "__init__.py": "VERSION = 1\n",
            "svc.py": "",
            "base.py": "",
            "sub/__init__.py": "",
            "sub/leaf.py": """
                from .. import base  # a submodule: low → low, fine
                from .. import svc  # a submodule: low → mid, up
                from .. import VERSION  # an attribute: the package itself, the top layer
                from ..base import helper  # an attribute of a submodule: that submodule
                import sqlalchemy  # outside the package: ignored
            """,
        },
    )
    assert import_graph(package)["fakepkg.sub.leaf"] == {
        "fakepkg.base": [2, 5],
        "fakepkg.svc": [3],
        "fakepkg": [4],
    }
    assert check_package(package, FAKE_LAYERS) == [
        "fakepkg.sub.leaf -> fakepkg (layer low imports layer top above it)"
        "  # fakepkg/sub/leaf.py:4",
        "fakepkg.sub.leaf -> fakepkg.svc (layer low imports layer mid above it)"
        "  # fakepkg/sub/leaf.py:3",
    ]


def test_checker_reports_unassigned_modules(tmp_path: Path) -> None:
    package = make_package(
        tmp_path,
        {
            "__init__.py": "",
            "base.py": "from . import extra\n",  # imports of unassigned modules are not judged
            "extra.py": "",
            "newpkg/__init__.py": "",
            "newpkg/thing.py": "",
            "sub/__init__.py": "",
            "sub/anything.py": "",  # covered by the fakepkg.sub entry
        },
    )
    assert unassigned_modules(package, FAKE_LAYERS) == [
        "fakepkg.extra",
        "fakepkg.newpkg",
        "fakepkg.newpkg.thing",
    ]
    assert check_package(package, FAKE_LAYERS) == [
        "fakepkg.extra is not assigned to a layer  # fakepkg/extra.py: add it to LAYERS",
        "fakepkg.newpkg is not assigned to a layer  # fakepkg/newpkg/__init__.py: add it to LAYERS",
        "fakepkg.newpkg.thing is not assigned to a layer"
        "  # fakepkg/newpkg/thing.py: add it to LAYERS",
    ]


def test_longest_prefix_wins_and_a_package_may_import_its_own_submodules(tmp_path: Path) -> None:
    package = make_package(
        tmp_path,
        {
            "__init__.py": "",
            "svc.py": "",
            "sub/__init__.py": "from . import serve\n",  # low package → its mid submodule: normal
            "sub/serve.py": "from . import util\nfrom .. import svc\n",  # mid → low, mid → mid
            "sub/util.py": "",
            "sub/leaf.py": "from .serve import main\n",  # low → mid: up
        },
    )
    root = "fakepkg"
    assert layer_of("fakepkg.sub.serve", FAKE_LAYERS, root) == "mid"
    assert layer_of("fakepkg.sub.leaf", FAKE_LAYERS, root) == "low"
    assert layer_of("fakepkg", FAKE_LAYERS, root) == "top"
    assert layer_of("fakepkg.unlisted", FAKE_LAYERS, root) is None  # the root entry is exact
    assert check_package(package, FAKE_LAYERS) == [
        "fakepkg.sub.leaf -> fakepkg.sub.serve (layer low imports layer mid above it)"
        "  # fakepkg/sub/leaf.py:1",
    ]


def test_checker_reports_exactly_the_planted_defects(tmp_path: Path) -> None:
    """All of the above at once, in a package that is otherwise clean."""
    package = make_package(
        tmp_path,
        {
            "__init__.py": "from .cli import main\nfrom .svc import run\n",
            "cli.py": "import fakepkg.svc\n\ndef main():\n    from . import a\n",
            "a.py": "from . import b\n",
            "b.py": "from .base import helper\n\ndef f():\n    from .a import x\n",
            "svc.py": "import typing\n",
            "base.py": "def helper():\n    from .svc import run\n",
            "sub/__init__.py": "from . import serve, leaf\n",
            "sub/serve.py": "from .. import svc\n",
            "sub/leaf.py": "from .. import base\nfrom .. import a\n",
            "orphan.py": "from .base import helper\n",
        },
    )
    assert check_package(package, FAKE_LAYERS) == [
        "import cycle between 2 modules: fakepkg.a, fakepkg.b"
        "  # e.g. fakepkg.a -> fakepkg.b -> fakepkg.a",
        "fakepkg.base -> fakepkg.svc (layer low imports layer mid above it)  # fakepkg/base.py:2",
        "fakepkg.sub.leaf -> fakepkg.a (layer low imports layer mid above it)"
        "  # fakepkg/sub/leaf.py:2",
        "fakepkg.orphan is not assigned to a layer  # fakepkg/orphan.py: add it to LAYERS",
    ]


# --- the real package --------------------------------------------------------------------------


def test_dbqueue_layering() -> None:
    violations = check_package(PACKAGE, LAYERS)
    if violations:
        pytest.fail(
            f"{len(violations)} layering violation(s) in dbqueue/ "
            "(layer order: "
            + " > ".join(LAYERS)
            + "; see LAYERS in tests/test_layers.py):\n"
            + "\n".join(violations),
            pytrace=False,
        )

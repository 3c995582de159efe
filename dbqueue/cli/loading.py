"""``--app module:attribute`` → the App it names; each way of getting it wrong is one line that
names the fix (the import's traceback only with ``-v``)."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from dbqueue.app.facade import App
from dbqueue.errors import ConfigurationError

EXAMPLE = "e.g. --app myproject.jobs:app"


def load_app(spec: str | None, verbose: bool = False) -> App | None:
    """``module:attribute`` (attribute default ``app``) → the App it names."""
    if not spec:
        return None
    module_name, _, attribute = spec.partition(":")
    attribute = attribute or "app"
    if _is_path(module_name):
        raise ConfigurationError(_path_given(spec, module_name, attribute))
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may raise anything while it loads
        if verbose:
            traceback.print_exception(exc, file=sys.stderr)
        raise ConfigurationError(f"--app {spec}: {_import_failure(module_name, exc)}") from None
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise ConfigurationError(f"--app {spec}: {_not_an_app(module, module_name, attribute)}")
    return app


def _is_path(module_name: str) -> bool:
    return "/" in module_name or "\\" in module_name or module_name.endswith(".py")


def _path_given(spec: str, module_name: str, attribute: str) -> str:
    path = Path(module_name)
    parts = [p for p in path.with_suffix("").parts if p not in (".", "")]
    dotted = ".".join(parts) or module_name
    folder = path.parent if str(path.parent) not in ("", ".") else None
    where = f" (from the folder that holds {parts[0]}, or with it on PYTHONPATH)" if folder else ""
    return (
        f"--app {spec}: that is a file path; --app takes a module's dotted name: "
        f"--app {dotted}:{attribute}{where}"
    )


def _import_failure(module_name: str, exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return (
            f"module {module_name!r} has a syntax error in {exc.filename} line {exc.lineno}: "
            f"{exc.msg}; fix it and run the command again"
        )
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if missing is not None and _is_self_or_parent(missing, module_name):
        return (
            f"there is no module {module_name!r} (looked in {os.getcwd()} and sys.path): check "
            f"the name, run the command from your project's folder, or set PYTHONPATH ({EXAMPLE})"
        )
    where = _raised_at(exc, module_name)
    if isinstance(exc, ImportError):
        inner = repr(missing) if missing else "a module"
        return (
            f"module {module_name!r} was found, but its own import of {inner} failed{where}: "
            f"{_first_line(exc)} (install it, or fix that import)"
        )
    return (
        f"module {module_name!r} was found, but importing it raised {type(exc).__name__}{where}: "
        f"{_first_line(exc)} (-v shows the traceback)"
    )


def _is_self_or_parent(missing: str, module_name: str) -> bool:
    return module_name == missing or module_name.startswith(missing + ".")


def _raised_at(exc: BaseException, module_name: str) -> str:
    """`` at FILE line N``: the innermost line of the user's code in the traceback."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith("<frozen") and "importlib" not in f.filename
    ]
    return f" at {frames[-1].filename} line {frames[-1].lineno}" if frames else ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _not_an_app(module: ModuleType, module_name: str, attribute: str) -> str:
    found: Any = getattr(module, attribute, None)
    apps = sorted(name for name, value in vars(module).items() if isinstance(value, App))
    if apps:
        fix = "use " + " or ".join(f"--app {module_name}:{name}" for name in apps)
    else:
        fix = f"the module has no dbqueue.App: create one there (app = dbqueue.App(…)) ({EXAMPLE})"
    if found is None and not hasattr(module, attribute):
        return f"module {module_name!r} has no attribute {attribute!r}; {fix}"
    kind = "None" if found is None else f"a {type(found).__name__}"
    return f"{module_name}.{attribute} is {kind}, not a dbqueue.App; {fix}"

"""dbqueue as a user installs it: the distribution's name in every install hint, the built wheel
in a fresh virtual environment running the README's quickstart (not the checkout), and the
Makefile's ``make demo`` installing only what the demo needs."""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from support.packaging import (
    ROOT,
    Wheelhouse,
    build_distributions,
    clean_environ,
    fresh_venv,
    pyproject,
)

from dbqueue.base.distribution import DISTRIBUTION, install_hint

README = ROOT / "README.md"
#: ``pip install 'NAME[extras]'`` or ``pip install NAME`` in prose, code and messages.
PIP_INSTALL = re.compile(r"pip install '?([A-Za-z0-9_.-]+)(?:\[([a-z0-9_,-]+)\])?")
#: The README's one sentence that names the other project on purpose.
OTHER_PROJECT = "`pip install dbqueue` installs that one"


def _files_with_install_hints() -> list[Path]:
    files = [README, ROOT / "Dockerfile", ROOT / "Makefile"]
    return files + sorted((ROOT / "dbqueue").rglob("*.py"))


def test_every_install_hint_names_the_distribution_and_an_extra_it_has() -> None:
    project = pyproject()["project"]
    extras = set(project["optional-dependencies"])
    assert project["name"] == DISTRIBUTION
    assert install_hint("asyncio") == f"pip install '{DISTRIBUTION}[asyncio]'"
    hints = []
    for path in _files_with_install_hints():
        text = path.read_text(encoding="utf-8").replace(OTHER_PROJECT, "")
        hints += [(path.name, *found.groups()) for found in PIP_INSTALL.finditer(text)]
    wrong = [
        hint
        for hint in hints
        if hint[1] == "dbqueue"
        or (hint[1] in {DISTRIBUTION, "."} and hint[2] and not set(hint[2].split(",")) <= extras)
    ]
    assert len(hints) >= 10 and not wrong, wrong


def test_the_dev_extra_names_the_distribution() -> None:
    """The dev set's own extras are asked for by the distribution's name (else pip would
    fetch them from the index's other project)."""
    dev = pyproject()["project"]["optional-dependencies"]["dev"]
    own = [req for req in dev if req.split("[", 1)[0] in {"dbqueue", DISTRIBUTION}]
    assert own == [f"{DISTRIBUTION}[asyncio,fast]"]


# The built wheel, in a fresh virtual environment.


@pytest.fixture(scope="module")
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(sdist, wheel, the fresh environment's bin folder): built and installed once."""
    wheelhouse = Wheelhouse(Path(request.config.cache.mkdir("wheelhouse")))
    work = tmp_path_factory.mktemp("packaging")
    sdist, wheel = build_distributions(work, wheelhouse)
    return sdist, wheel, fresh_venv(work / "venv", wheel, wheelhouse)


def quickstart() -> tuple[str, list[str]]:
    """The README's quickstart: the Python file's text and the shell lines that follow it."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("<!-- quickstart:") :]
    python, shell = re.findall(r"```(?:python|sh)\n(.*?)```", section, re.S)[:2]
    return python, [line for line in shell.splitlines() if line.strip()]


def test_the_wheel_runs_the_readmes_quickstart_on_sqlite(built, tmp_path: Path) -> None:
    *_, bin_dir = built
    python, lines = quickstart()
    filename = python.splitlines()[0].removeprefix("# ").strip()
    (tmp_path / filename).write_text(python)
    env = clean_environ(extra_path=bin_dir)
    where = subprocess.run(
        ["python", "-c", "import dbqueue; print(dbqueue.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(bin_dir.parent), where.stderr
    assert len(lines) >= 4
    for line in lines:
        done = subprocess.run(
            line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        claim = line.partition("# prints: ")[2].strip()
        if claim:
            assert claim in (done.stdout + done.stderr).splitlines(), (line, done)


def test_the_installed_distribution_has_its_name_command_and_types(built) -> None:
    _sdist, wheel, bin_dir = built
    version = subprocess.run(
        [str(bin_dir / "python"), "-c",
         f"from importlib import metadata; print(metadata.version({DISTRIBUTION!r}))"],
        env=clean_environ(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert version.stdout.strip() == pyproject()["project"]["version"], version.stderr
    command = subprocess.run(
        [str(bin_dir / "dbqueue"), "--version"],
        env=clean_environ(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert command.stdout.strip() == f"dbqueue, version {version.stdout.strip()}", command.stderr
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"dbqueue/py.typed", "dbqueue/job.py"} <= names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)


def test_the_sdist_holds_the_license_and_the_migrations(built) -> None:
    import tarfile

    sdist, *_ = built
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"LICENSE", "pyproject.toml", "README.md"} <= names
    assert any(name.startswith("dbqueue/migrations/versions/0001") for name in names)


# make demo: only what the demo needs, in the .venv make test shares.


def _make(target: str, *, cwd: Path = ROOT, dry: bool = True, **variables: str) -> list[str]:
    assignments = [f"{name}={value}" for name, value in variables.items()]
    done = subprocess.run(
        ["make", "--no-print-directory", *(["-n", "-B"] if dry else []), *assignments, target],
        cwd=cwd, env=clean_environ(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def _installed(lines: list[str]) -> list[str]:
    """What each ``pip install`` line asks for: its requirements, without its options."""
    asked = []
    for line in lines:
        words = shlex.split(line)
        if "pip" in Path(words[0]).name and words[1:2] == ["install"]:
            asked += [word for word in words[2:] if not word.startswith("-")]
    return asked


def test_make_demo_installs_the_package_alone_and_make_test_the_dev_set() -> None:
    assert _installed(_make("demo")) == ["pip", "."]
    assert _installed(_make("test")) == ["pip", ".[dev,singlestore]"]


def _fake_tools(folder: Path) -> None:
    """A ``python3`` whose venvs' pip and python, and a services script, only log their
    arguments (to ``folder/log``)."""
    logger = f'#!/bin/sh\necho "$(basename "$0") $*" >> {folder / "log"}\n'
    venv_maker = logger + 'if [ "$1 $2" = "-m venv" ]; then\n  mkdir -p "$3/bin"\n'
    venv_maker += "".join(
        f'  cp {folder / "logger"} "$3/bin/{tool}"\n' for tool in ("pip", "python")
    )
    venv_maker += "fi\n"
    scripts = {"logger": logger, "python3": venv_maker, "scripts/ensure-services.sh": logger}
    for name, text in scripts.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The Makefile and pyproject.toml in a folder of their own, with tools that only log."""
    for name in ("Makefile", "pyproject.toml"):
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    past = time.time() - 3600
    os.utime(tmp_path / "pyproject.toml", (past, past))
    _fake_tools(tmp_path)
    return tmp_path


def _run_make(checkout: Path, target: str) -> list[str]:
    """The commands the tools saw during one real ``make TARGET`` (the log is emptied)."""
    _make(target, cwd=checkout, dry=False, PYTHON=str(checkout / "python3"))
    log = checkout / "log"
    seen = log.read_text().splitlines()
    log.unlink()
    return seen


def test_make_demo_and_make_test_share_the_venv_in_either_order(checkout: Path) -> None:
    demo_then_test = [_run_make(checkout, "demo"), _run_make(checkout, "test")]
    assert [_installed(seen) for seen in demo_then_test] == [["pip", "."], [".[dev,singlestore]"]]
    assert demo_then_test[0][-1] == "python -m dbqueue.demo"
    assert _installed(_run_make(checkout, "demo")) == []  # the dev set holds the demo's
    assert _installed(_run_make(checkout, "test")) == []
    for stamp in (checkout / ".venv").glob(".installed-*"):  # pyproject.toml changes after:
        os.utime(stamp, (time.time() - 1800, time.time() - 1800))  # each set is installed again
    os.utime(checkout / "pyproject.toml")
    assert _installed(_run_make(checkout, "test")) == [".[dev,singlestore]"]
    assert _installed(_run_make(checkout, "demo")) == []

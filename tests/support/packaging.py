"""The sdist and wheel built from a copy of the checkout, installed into a fresh virtual
environment, the way a user installs them.

Building and installing need packages from the index (the build backend; the wheel's
dependencies). They come from a wheelhouse in pytest's cache, filled from the index the first
time something is missing from it: on a machine that filled it once, no run needs the network.
The dependencies are pinned to the versions the test environment runs, so the fresh environment
runs what the rest of the suite tested.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
#: What the build reads besides the package: pyproject.toml names the other two.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE")
#: Variables that would point the installed package back at the checkout or at a database.
_LEAKING = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
_DATABASE_PREFIXES = ("DBQUEUE_", "DB_", "DATABASE_")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def clean_environ(extra_path: Path | None = None) -> dict[str, str]:
    """This process's environment without the checkout on PYTHONPATH or any database setting."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in _LEAKING and not name.startswith(_DATABASE_PREFIXES)
    }
    if extra_path is not None:
        env["PATH"] = f"{extra_path}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None):
    return subprocess.run(
        args, cwd=cwd, env=env or clean_environ(), capture_output=True, text=True, timeout=900
    )


@dataclass(frozen=True)
class Wheelhouse:
    """A folder of wheels pip installs from with ``--no-index``, topped up from the index."""

    path: Path

    def pins(self) -> Path:
        """Constraints: every distribution of the test environment at the version it imports."""
        own = {pyproject()["project"]["name"], "dbqueue"}
        versions: dict[str, str] = {}
        for dist in metadata.distributions():  # in sys.path order: the first one is imported
            name = (dist.metadata["Name"] or "").lower().replace("_", "-")
            if name and name not in own:
                versions.setdefault(name, dist.version)
        path = self.path / "pins.txt"
        path.write_text("".join(f"{name}=={v}\n" for name, v in sorted(versions.items())))
        return path

    def offline_env(self) -> dict[str, str]:
        """For pip run by another tool (the build's isolated environment): this folder only."""
        return {**clean_environ(), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(self.path)}

    def top_up(self, *requirements: str, pinned: bool = True) -> None:
        """Wheels of ``requirements`` and their dependencies into the folder (from the index or
        pip's cache; an sdist is built into a wheel here, so that installing builds nothing),
        ``pinned`` to the test environment's versions (not the build backend's: the test
        environment's own may be older than the build requires)."""
        self.path.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(self.path)]
        if pinned:
            args += ["--constraint", str(self.pins())]
        done = _run([*args, *requirements])
        assert done.returncode == 0, done.stdout + done.stderr
        for own in self.path.glob("dbqueue_sql-*"):  # the wheel under test is passed by path
            own.unlink()


def build_distributions(outdir: Path, wheelhouse: Wheelhouse) -> tuple[Path, Path]:
    """The sdist, and the wheel built from it (as ``make wheel`` does), from a copy of the
    checkout so that the build leaves nothing in it."""
    source = outdir / "source"
    shutil.copytree(
        ROOT / "dbqueue", source / "dbqueue", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in BUILD_INPUTS:
        shutil.copy(ROOT / name, source / name)
    dist = outdir / "dist"
    args = [sys.executable, "-m", "build", "--outdir", str(dist), str(source)]
    done = _run(args, env=wheelhouse.offline_env())
    if done.returncode != 0:  # the backend is not in the wheelhouse yet
        wheelhouse.top_up(*pyproject()["build-system"]["requires"], pinned=False)
        done = _run(args, env=wheelhouse.offline_env())
    assert done.returncode == 0, done.stdout + done.stderr
    (sdist,) = dist.glob("dbqueue_sql-*.tar.gz")
    (wheel,) = dist.glob("dbqueue_sql-*.whl")
    return sdist, wheel


def fresh_venv(path: Path, wheel: Path, wheelhouse: Wheelhouse) -> Path:
    """A new virtual environment with ``wheel`` and its dependencies installed; its bin folder.
    It has no pip of its own: this environment's pip installs into it (``pip --python``)."""
    done = _run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    assert done.returncode == 0, done.stdout + done.stderr
    bin_dir = path / ("Scripts" if os.name == "nt" else "bin")
    install = [
        *(sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install"),
        *("--quiet", "--no-index", "--find-links", str(wheelhouse.path), str(wheel)),
    ]
    done = _run(install)
    if done.returncode != 0:  # a dependency is not in the wheelhouse yet
        wheelhouse.top_up(str(wheel))
        done = _run(install)
    assert done.returncode == 0, done.stdout + done.stderr
    return bin_dir

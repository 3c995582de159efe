"""The README's layer table is the one ``scripts/layers.py`` generates from pyproject.toml's layer
list and the docstrings: a layer, folder or docstring changed without rerunning it fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "layers.py"


def layers(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )


def test_the_readme_layer_table_is_up_to_date() -> None:
    done = layers("--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_stale_table_fails_the_check_and_a_run_rewrites_it(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    current = (ROOT / "README.md").read_text(encoding="utf-8")
    readme.write_text(
        current.replace("<!-- layers:end -->", "| stray | row | here |\n<!-- layers:end -->"),
        encoding="utf-8",
    )
    stale = layers("--check", "--readme", str(readme))
    assert stale.returncode == 1
    assert "run python scripts/layers.py" in stale.stderr
    assert layers("--readme", str(readme)).returncode == 0
    assert readme.read_text(encoding="utf-8") == current

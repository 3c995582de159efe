"""The name dbqueue is installed under, for the hints that say what to install: the package
index's ``dbqueue`` is another project, which installing by that name would fetch."""

from __future__ import annotations

from importlib import metadata

#: pyproject.toml's ``[project] name`` (the import package and the command are ``dbqueue``).
DISTRIBUTION = "dbqueue-sql"


def install_hint(extra: str) -> str:
    """The command that installs one of dbqueue's optional extras."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def installed_version() -> str | None:
    """The installed distribution's version; None when running from a checkout never installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None

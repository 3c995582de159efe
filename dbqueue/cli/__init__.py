"""The ``dbqueue`` command line (``main``), a module per command group, and its log formats."""

from dbqueue.cli.main import main

__all__ = ["main"]

"""The ``dbqueue`` command line (``main``) and its log formats."""

from dbqueue.cli.main import main

__all__ = ["main"]

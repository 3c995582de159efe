"""The ``dbqueue`` command line (``main``; the group in ``main.py``, each command group in a module
of its own, the options they share in ``options.py``) and its log formats."""

from dbqueue.cli.main import main

__all__ = ["main"]

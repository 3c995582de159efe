"""``python -m dbqueue``: the ``dbqueue`` command."""

from dbqueue.cli import main

if __name__ == "__main__":
    main()

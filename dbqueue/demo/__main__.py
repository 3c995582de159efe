"""``python -m dbqueue.demo`` (``make demo``)."""

import sys

from dbqueue.demo import main

if __name__ == "__main__":
    sys.exit(main())

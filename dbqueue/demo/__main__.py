"""``python -m dbqueue.demo`` (``make demo``)."""

import sys

from dbqueue.demo import main

sys.exit(main())

"""``dbqueue.db_gen``: ``python -m dbqueue.db_gen``, the seed's DDL generator.

A documented import path, kept: the code lives in ``dbqueue.compat.db_gen``."""

import sys

from dbqueue.compat.db_gen import (
    SUBSCRIBER_SUFFIX,
    USAGE,
    header,
    main,
    offline_url,
    parser,
    table_names,
)

__all__ = [
    "USAGE",
    "SUBSCRIBER_SUFFIX",
    "parser",
    "table_names",
    "offline_url",
    "header",
    "main",
]

if __name__ == "__main__":
    sys.exit(main())

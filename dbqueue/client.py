"""``dbqueue.client``: the options of ``App.enqueue`` and the targets it writes to.

A documented import path, kept: the code lives in ``dbqueue.runtime.enqueue`` and
``dbqueue.runtime.targets``."""

from dbqueue.runtime.enqueue import (
    OPTION_NAMES,
    PLAIN_ITEM,
    EnqueueOptions,
    build_job,
    check_no_unique,
    check_option_names,
    coalescing,
    insert_job,
    job_for_task,
    plain_rows,
)
from dbqueue.runtime.targets import Target, connection_for, current_session, write_target

__all__ = [
    "Target",
    "EnqueueOptions",
    "OPTION_NAMES",
    "check_option_names",
    "check_no_unique",
    "insert_job",
    "job_for_task",
    "PLAIN_ITEM",
    "plain_rows",
    "coalescing",
    "write_target",
    "current_session",
    "connection_for",
    "build_job",
]

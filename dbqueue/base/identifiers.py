"""Validation of the names dbqueue puts into DDL and of queue names.

Table, schema and prefix names become SQL identifiers (SQLAlchemy quotes them, but a name that
needs quoting is almost always a mistake, and a long one is silently truncated by PostgreSQL).
Queue and task names are only ever bound parameters, yet they appear in logs, CLI output and
LISTEN channel names, so they get a conservative character set too.
"""

from __future__ import annotations

import re

from dbqueue.errors import UnsafeIdentifierError

# 63 is PostgreSQL's identifier limit; MySQL allows 64. Table names are prefix + a suffix of up to
# 22 characters ("subscriptions_alembic"), so a prefix is capped lower.
MAX_IDENTIFIER = 63
MAX_PREFIX = 40
MAX_QUEUE_NAME = 64
MAX_TASK_NAME = 200
MAX_SUBSCRIPTION_ID = 100

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z|\Z")
_QUEUE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]*\Z")
_SUBSCRIPTION = _QUEUE  # letters, digits, _ . : - (never "*", which marks a publication)
_TASK = re.compile(r"[^\x00-\x1f\x7f]+\Z")


def check_identifier(value: str, what: str) -> str:
    """Return ``value`` if it is a plain SQL identifier, else raise with the rule it broke."""
    if not isinstance(value, str) or not _IDENTIFIER.match(value) or len(value) > MAX_IDENTIFIER:
        raise UnsafeIdentifierError(
            f"{what} {value!r} is not a safe SQL identifier: use 1-{MAX_IDENTIFIER} letters, "
            "digits or underscores, starting with a letter or underscore (e.g. 'billing_jobs')."
        )
    return value


def check_prefix(value: str) -> str:
    """A table prefix may be empty; otherwise it follows the identifier rule, shorter."""
    if not isinstance(value, str) or not _PREFIX.match(value) or len(value) > MAX_PREFIX:
        raise UnsafeIdentifierError(
            f"table prefix {value!r} is not safe: use up to {MAX_PREFIX} letters, digits or "
            "underscores, starting with a letter or underscore (e.g. 'billing_')."
        )
    return value


def check_queue_name(value: str) -> str:
    if not isinstance(value, str) or not _QUEUE.match(value) or len(value) > MAX_QUEUE_NAME:
        raise UnsafeIdentifierError(
            f"queue name {value!r} is not allowed: use 1-{MAX_QUEUE_NAME} characters from "
            "letters, digits and _ . : - (e.g. 'billing' or 'emails.high')."
        )
    return value


def check_task_name(value: str) -> str:
    if not isinstance(value, str) or not _TASK.match(value) or len(value) > MAX_TASK_NAME:
        raise UnsafeIdentifierError(
            f"task name {value!r} is not allowed: use 1-{MAX_TASK_NAME} printable characters "
            "(e.g. 'send_invoice')."
        )
    return value


def check_subscription_id(value: str) -> str:
    if (
        not isinstance(value, str)
        or not _SUBSCRIPTION.match(value)
        or len(value) > MAX_SUBSCRIPTION_ID
    ):
        raise UnsafeIdentifierError(
            f"subscription id {value!r} is not allowed: use 1-{MAX_SUBSCRIPTION_ID} characters "
            "from letters, digits and _ . : - (e.g. 'crm-webhook' or 'search_index')."
        )
    return value

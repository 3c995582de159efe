"""The client side: validate what the caller asks for, then insert it in the caller's transaction.

Enqueue is one INSERT on a connection the application already holds (promise 3): the target is
the caller's ORM Session (or a ``scoped_session`` such as Flask-SQLAlchemy's ``db.session``) or
Connection, whose transaction the job joins, or an Engine, in which case dbqueue opens and
commits a short transaction of its own.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from sqlalchemy.engine import Connection

from dbqueue.base import payload as payload_codec
from dbqueue.base.identifiers import check_queue_name, check_task_name
from dbqueue.engine import ALWAYS, COALESCE, ON_CONFLICT, NewJob
from dbqueue.errors import ConfigurationError
from dbqueue.schema.tables import DEFAULT_PRIORITY, MAX_KEY_CHARS, MAX_UNIQUE_KEY
from dbqueue.tasks.suggestions import warn_unregistered

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext

_INT32 = (-(2**31), 2**31 - 1)
_TEXT_LIMITS = {
    "external_key": 255,
    "origin": 255,
    "destination": 255,
    "business_group": 100,
    "unique_key": MAX_UNIQUE_KEY,
    "key": MAX_KEY_CHARS,
}


class EnqueueOptions(TypedDict, total=False):
    """The options of every call that creates jobs (``enqueue``, the items of ``enqueue_many``,
    ``publish``, ``publish_webhook``): written once, so the calls cannot drift apart."""

    queue: str | None
    priority: int | None  # lower runs first; default 50
    delay: float | dt.timedelta | None  # seconds from now
    run_at: dt.datetime | None  # an aware datetime; not with delay
    max_attempts: int | None
    external_key: str | None
    origin: str | None
    destination: str | None
    tenant: int | None
    business_group: str | None
    unique_key: str | None  # unique among the queue's unfinished jobs
    on_conflict: str | None  # "skip" (default), "replace" or "rerun"
    score: float | None  # a coalescing task's payload order (default: enqueue time)
    key: str | None  # jobs of the queue sharing a key never run at once (see key_mode)


OPTION_NAMES = frozenset(EnqueueOptions.__annotations__)


def check_option_names(call: str, options: Mapping[str, Any]) -> None:
    if options.keys() <= OPTION_NAMES:
        return
    unknown = sorted(set(options) - OPTION_NAMES)
    if unknown:
        raise TypeError(
            f"{call}() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}: "
            f"the options are {', '.join(sorted(OPTION_NAMES))}"
        )


def check_no_unique(call: str, options: Mapping[str, Any]) -> None:
    """A publication makes one job per subscriber, in one queue: one unique key cannot hold
    for all of them."""
    if any(options.get(name) is not None for name in ("unique_key", "on_conflict", "score")):
        raise ConfigurationError(
            f"{call}() takes no unique_key/on_conflict/score (each subscriber gets its own job): "
            "enqueue a unique job that publishes instead"
        )


def insert_job(engine: Any, conn: Connection, job: NewJob) -> int:
    """One job, through its unique key's rules when it has one."""
    if job.unique_key is not None:
        return engine.unique.insert_unique(conn, job, job.on_conflict or "skip")
    return engine.inserts.insert(conn, job)


def job_for_task(
    context: RuntimeContext, task: str, payload: Any, options: Mapping[str, Any]
) -> NewJob:
    """A validated job: explicit options, else the task's registered ones, else the App's."""
    if not options:
        return _plain_job(context, task, payload)
    options = dict(options)
    definition = context.registry.get(task)
    queue = options.pop("queue", None) or (definition and definition.queue)
    priority = options.pop("priority", None)
    if priority is None and definition is not None:
        priority = definition.priority
    max_attempts = options.pop("max_attempts", None)
    if max_attempts is None:
        max_attempts = (definition and definition.max_attempts) or context.max_attempts
    score = options.pop("score", None)
    coalesce = definition is not None and definition.coalesce and options.get("key") is not None
    if coalesce and options.get("unique_key") is not None:
        raise ConfigurationError(
            f"task {task!r} coalesces by key: its jobs take no unique_key (they merge by key)"
        )
    if score is not None and not coalesce:
        raise ConfigurationError(
            "score orders the payloads of a coalescing task: register the task with "
            "coalesce=True and enqueue with a key"
        )
    job = build_job(
        task,
        payload,
        queue=queue or context.default_queue,
        priority=DEFAULT_PRIORITY if priority is None else priority,
        max_attempts=max_attempts,
        max_payload_bytes=context.max_payload_bytes,
        **options,
    )
    if definition is None:
        warn_unregistered(context.registry, task)
    return coalescing(job, task, score) if coalesce else job


def _plain_job(context: RuntimeContext, task: str, payload: Any) -> NewJob:
    """``job_for_task`` without options, the common enqueue: the same values and checks
    without the option handling (dict copies, keyword arguments), a third of its CPU."""
    queue, priority, max_attempts = _plain_defaults(context, task)
    encoded = payload_codec.encode(payload, context.max_payload_bytes)
    return NewJob(task, encoded, queue, priority, max_attempts)


def _plain_defaults(context: RuntimeContext, task: str) -> tuple[str, int, int]:
    """(queue, priority, max_attempts) of a job that sets no option: the task's registered
    ones, else the App's; checked."""
    definition = context.registry.get(task)
    if definition is None:
        queue, priority, max_attempts = context.default_queue, None, None
    else:
        queue, priority, max_attempts = (
            definition.queue,
            definition.priority,
            definition.max_attempts,
        )
    queue = queue or context.default_queue
    if priority is None:
        priority = DEFAULT_PRIORITY
    max_attempts = max_attempts or context.max_attempts
    _check_names(task, queue)
    if definition is None:
        warn_unregistered(context.registry, task)
    if type(priority) is not int or not _INT32[0] <= priority <= _INT32[1]:
        priority = _check_int("priority", priority)
    if type(max_attempts) is not int or not 1 <= max_attempts <= _INT32[1]:
        max_attempts = _check_int("max_attempts", max_attempts, minimum=1)
    return queue, priority, max_attempts


#: The keys of an ``enqueue_many`` item that sets no option.
PLAIN_ITEM = frozenset(("task", "payload"))
#: ``plain_rows`` writes each row in this order.
assert ALWAYS == ("task", "queue", "payload", "payload_hash", "priority", "max_attempts")


def plain_rows(context: RuntimeContext, items: Sequence[Mapping[str, Any]]) -> list[Any] | None:
    """The insert columns (``ALWAYS``, in order) of ``enqueue_many`` items that set no option,
    row after row in one list — what ``flat_values`` makes of their NewJobs, without a NewJob
    per item or the task's defaults looked up and checked per item (a third of a bulk
    enqueue's CPU). None when some item sets an option or names its task oddly: those take
    the general path, which validates and explains."""
    flat: list[Any] = []
    extend = flat.extend
    encode_and_hash = payload_codec.encode_and_hash
    limit = context.max_payload_bytes
    defaults: dict[str, tuple[str, int, int]] = {}
    for item in items:
        if not item.keys() <= PLAIN_ITEM or type(task := item.get("task")) is not str:
            return None
        found = defaults.get(task)
        if found is None:
            found = defaults[task] = _plain_defaults(context, task)
        text, digest = encode_and_hash(item.get("payload"), limit)
        extend((task, found[0], text, digest, found[1], found[2]))
    return flat


def coalescing(job: NewJob, task: str, score: Any) -> NewJob:
    """A coalescing task's job: its key made the unique key its enqueues merge on, its payload
    the first of its scored payloads."""
    if score is None:
        score = time.time()
    if isinstance(score, bool) or not isinstance(score, (int, float)) or score != score:
        raise ConfigurationError(f"score={score!r} must be a number (default: the enqueue time)")
    assert job.key is not None
    unique_key = f"coalesce:{task}:{job.key}"
    if len(unique_key) > MAX_UNIQUE_KEY:
        unique_key = "coalesce:" + hashlib.sha256(unique_key.encode()).hexdigest()
    job.unique_key, job.on_conflict = unique_key, COALESCE
    payload = job.payload if job.payload is not None else "null"
    job.scored_payloads = payload_codec.EncodedPayload(f"[[{json.dumps(float(score))}, {payload}]]")
    return job


def _check_int(name: str, value: Any, minimum: int = _INT32[0]) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{name}={value!r} must be a whole number")
    if not minimum <= value <= _INT32[1]:
        raise ConfigurationError(f"{name}={value!r} must be between {minimum} and {_INT32[1]}")
    return value


def _check_text(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        value = str(value)
    limit = _TEXT_LIMITS[name]
    if len(value) > limit:
        raise ConfigurationError(f"{name} is {len(value)} characters long; the limit is {limit}")
    return value


def _check_timing(delay: Any, run_at: Any) -> tuple[float | None, dt.datetime | None]:
    if delay is not None and run_at is not None:
        raise ConfigurationError("pass either delay or run_at, not both")
    if isinstance(delay, dt.timedelta):
        delay = delay.total_seconds()
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
            raise ConfigurationError(
                f"delay={delay!r} must be a number of seconds (or a timedelta), 0 or more"
            )
        delay = float(delay) or None
    if run_at is not None:
        if not isinstance(run_at, dt.datetime):
            raise ConfigurationError(f"run_at={run_at!r} must be a datetime")
        if run_at.tzinfo is None:
            raise ConfigurationError(
                f"run_at={run_at!r} has no time zone: pass an aware datetime, e.g. "
                "datetime.now(timezone.utc) + timedelta(minutes=5)"
            )
    return delay, run_at


def build_job(
    task: str,
    payload: Any,
    *,
    queue: str,
    priority: int,
    max_attempts: int,
    max_payload_bytes: int | None,
    delay: float | dt.timedelta | None = None,
    run_at: dt.datetime | None = None,
    external_key: str | None = None,
    origin: str | None = None,
    destination: str | None = None,
    tenant: int | None = None,
    business_group: str | None = None,
    publication_id: int | None = None,
    subscription_id: str | None = None,
    unique_key: str | None = None,
    on_conflict: str | None = None,
    key: str | None = None,
) -> NewJob:
    """Validate one job request; every problem is reported before anything touches the database.
    Each check runs only for a value that is set: most jobs set no optional column."""
    _check_names(task, queue)
    if delay is not None or run_at is not None:
        delay, run_at = _check_timing(delay, run_at)
    if tenant is not None:
        tenant = _check_int("tenant", tenant, minimum=-(2**63))
    encoded = payload_codec.encode(payload, max_payload_bytes)
    if type(priority) is not int or not _INT32[0] <= priority <= _INT32[1]:
        priority = _check_int("priority", priority)
    if type(max_attempts) is not int or not 1 <= max_attempts <= _INT32[1]:
        max_attempts = _check_int("max_attempts", max_attempts, minimum=1)
    job = NewJob(
        task,
        encoded,
        queue,
        priority,
        max_attempts,
        delay,
        run_at,
        publication_id=publication_id,
        subscription_id=subscription_id,
        tenant=tenant,
    )
    if external_key is not None or origin is not None or destination is not None:
        job.external_key = _check_text("external_key", external_key)
        job.origin = _check_text("origin", origin)
        job.destination = _check_text("destination", destination)
    if business_group is not None:
        job.business_group = _check_text("business_group", business_group)
    if unique_key is not None or on_conflict is not None:
        job.unique_key = _check_text("unique_key", unique_key)
        job.on_conflict = _check_on_conflict(unique_key, on_conflict)
    if key is not None:
        job.key = _check_key(key)
    return job


_CHECKED_NAMES: set[tuple[str, str]] = set()
#: Distinct (task, queue) pairs remembered as valid: an application has few; past this many
#: the checks simply run again.
_MAX_CHECKED_NAMES = 10_000


def _check_names(task: Any, queue: Any) -> None:
    """Task and queue names, checked once per pair (a regular expression each)."""
    if type(task) is str and type(queue) is str and (task, queue) in _CHECKED_NAMES:
        return
    check_task_name(task)
    check_queue_name(queue)
    if type(task) is str and type(queue) is str and len(_CHECKED_NAMES) < _MAX_CHECKED_NAMES:
        _CHECKED_NAMES.add((task, queue))


def _check_on_conflict(unique_key: Any, on_conflict: Any) -> str | None:
    if on_conflict is None:
        return None if unique_key is None else "skip"
    if on_conflict not in ON_CONFLICT:
        raise ConfigurationError(
            f"on_conflict={on_conflict!r} is not one of {', '.join(map(repr, ON_CONFLICT))}"
        )
    if unique_key is None:
        raise ConfigurationError(
            f"on_conflict={on_conflict!r} needs a unique_key: pass unique_key=… too"
        )
    return on_conflict


def _check_key(key: Any) -> str | None:
    if key is None:
        return None
    if not isinstance(key, (str, int)) or isinstance(key, bool):
        raise ConfigurationError(
            f"key={key!r} must be a string (or a whole number), e.g. key=f'account:{{id}}'"
        )
    key = str(key)
    if not key:
        raise ConfigurationError("key='' is empty: pass None for a job without a key")
    return _check_text("key", key)

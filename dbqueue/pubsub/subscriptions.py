"""Pub/sub: the subscriptions table, and what a publication writes to the jobs table.

A topic is a task name; a subscription (a row of ``<prefix>subscriptions``) says who receives
it — code registered for the subscription's id, or a webhook (its ``url``). Publishing fans out
at once, in the caller's transaction: each matching active subscription gets its own job (a
*delivery*: ``task`` = topic, ``subscription_id``, ``publication_id``) with its own status,
attempts and retries, so one subscriber failing never re-runs or blocks another. The
publication itself is one more row, inserted already finished, whose id is the publication id
and whose ``subscription_id`` is ``*``; its message lists who it went to, or says that no
subscription matched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict
from urllib.parse import urlsplit, urlunsplit

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dbqueue import dialects
from dbqueue.base.identifiers import check_subscription_id, check_task_name
from dbqueue.engine import catalog
from dbqueue.errors import ConfigurationError, SchemaMissingError
from dbqueue.job import ItemAccess
from dbqueue.schema.tables import DEFAULT_HTTP_METHOD, HTTP_METHODS, QueueTables
from dbqueue.tasks.registry import ANY_TOPIC

#: ``subscription_id`` of a publication's own record (never a valid subscription id).
MAX_URL_CHARS = 2000
MAX_BUSINESS_GROUP_CHARS = 100

# Header names whose values are credentials: never printed by dbqueue (CLI, job messages, logs).
_SECRET_HEADER_WORDS = (
    "auth",
    "cookie",
    "token",
    "secret",
    "password",
    "passwd",
    "key",
    "signature",
    "session",
    "credential",
)
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")  # RFC 9110 token


def is_secret_header(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_HEADER_WORDS)


def redact_headers(headers: Any) -> Any:
    """Headers with the values of credential-like ones replaced by ``***``."""
    if not isinstance(headers, Mapping):
        return headers
    return {k: "***" if is_secret_header(str(k)) else v for k, v in headers.items()}


# ---- validation (every problem is reported before anything touches the database) ------------
def check_method(method: Any) -> str:
    if not isinstance(method, str) or method.strip().upper() not in HTTP_METHODS:
        raise ConfigurationError(
            f"http method {method!r} is not supported for webhooks: use "
            f"{', '.join(HTTP_METHODS[:-1])} or {HTTP_METHODS[-1]}"
        )
    return method.strip().upper()


def check_url(url: Any) -> str:
    """An absolute http(s) URL with a host; a webhook is never sent anywhere else."""
    example = "e.g. https://example.com/hooks/orders"
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(f"webhook url {url!r} is empty: give an http(s) URL, {example}")
    url = url.strip()
    if len(url) > MAX_URL_CHARS:
        raise ConfigurationError(
            f"webhook url is {len(url)} characters long; the limit is {MAX_URL_CHARS}"
        )
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise ConfigurationError("webhook url contains spaces or control characters: encode them")
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port  # .port raises on a bad port number
    except ValueError as exc:
        raise ConfigurationError(f"webhook url cannot be parsed ({exc}): {example}") from None
    if parts.scheme not in ("http", "https") or not host:
        shown = display_url(url) if host else url.split("?")[0]
        raise ConfigurationError(
            f"webhook url {shown!r} is not an absolute http(s) URL with a host: {example}"
        )
    return url


def display_url(url: str) -> str:
    """The URL without credentials or query string: what messages and logs may show."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(unparsable url)"
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    query = "?…" if parts.query else ""
    return f"{parts.scheme}://{host}{port}{parts.path}{query}"


def redact_url(url: str | None) -> str | None:
    """The URL with its password and credential-like query values replaced by ``***``."""
    if not url:
        return url
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password:
            netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    except ValueError:
        return "(unparsable url)"
    pairs = []
    for pair in parts.query.split("&") if parts.query else []:
        name, sep, value = pair.partition("=")
        pairs.append(f"{name}={'***'}" if sep and is_secret_header(name) else pair)
    return urlunsplit(parts._replace(netloc=netloc, query="&".join(pairs)))


def check_headers(headers: Any) -> dict[str, str]:
    """A JSON object of header name → text value, safe to send (no line breaks)."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise ConfigurationError(
            f"webhook headers must be a JSON object of name → value, not "
            f'{type(headers).__name__}: e.g. {{"Authorization": "Bearer …"}}'
        )
    checked: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise ConfigurationError(
                f"webhook header name {name!r} is not valid: use letters, digits and - "
                "(e.g. X-Signature)"
            )
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ConfigurationError(
                f"webhook header {name}: its value must be text, not {type(value).__name__}"
            )
        text = str(value)
        if any(c in text for c in "\r\n\x00"):
            raise ConfigurationError(
                f"webhook header {name}: its value contains a line break, which would inject "
                "other headers: remove it"
            )
        try:
            text.encode("latin-1")
        except UnicodeEncodeError:
            raise ConfigurationError(
                f"webhook header {name}: its value has characters an HTTP header cannot carry "
                "(only Latin-1): percent-encode or base64-encode it"
            ) from None
        checked[name] = text
    return checked


def parse_header(text: str) -> tuple[str, str]:
    """``'Name: value'`` (the CLI's ``--header``) → (name, value)."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise ConfigurationError(
            f"--header {text!r} is not 'Name: value': e.g. --header 'Authorization: Bearer …'"
        )
    return name.strip(), value.strip()


def _check_tenant(tenant: Any) -> int | None:
    if tenant is None:
        return None
    if isinstance(tenant, bool) or not isinstance(tenant, int):
        raise ConfigurationError(f"tenant={tenant!r} must be a whole number")
    if not -(2**63) <= tenant < 2**63:
        raise ConfigurationError(f"tenant={tenant!r} does not fit in a bigint")
    return tenant


def _check_business_group(group: Any) -> str | None:
    if group is None:
        return None
    group = str(group)
    if len(group) > MAX_BUSINESS_GROUP_CHARS:
        raise ConfigurationError(
            f"business_group is {len(group)} characters long; the limit is "
            f"{MAX_BUSINESS_GROUP_CHARS}"
        )
    return group


# ---- the value ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Subscription(ItemAccess):
    """One row of the subscriptions table. ``headers`` is what is stored (normally a dict)."""

    #: The seed's column names (``subscription["processo"]``).
    ITEM_ALIASES: ClassVar[Mapping[str, str | Callable[[Subscription], Any]]] = {
        "id": "id",
        "tenant": "tenant",
        "grupo_empresarial": "business_group",
        "processo": "topic",
        "url": "url",
        "http_method": "http_method",
        "headers": "headers",
        "ativo": "active",
        "created_at": "created_at",
    }

    id: str
    topic: str
    tenant: int | None = None
    business_group: str | None = None
    url: str | None = None
    http_method: str | None = DEFAULT_HTTP_METHOD
    headers: Any = None
    active: bool = True
    created_at: dt.datetime | None = None

    @classmethod
    def from_row(cls, row: Any) -> Subscription:
        values = dict(row._mapping)
        values["active"] = bool(values["active"])
        return cls(**values)

    @property
    def method(self) -> str:
        """The HTTP method as sent (NULL or empty in the row means POST)."""
        return (self.http_method or DEFAULT_HTTP_METHOD).strip().upper()

    @property
    def is_webhook(self) -> bool:
        return bool(self.url and self.url.strip())

    def as_dict(self, *, redact: bool = True) -> dict[str, Any]:
        """The row as a dict; credentials (password in the url, credential-like query values and
        header values) are hidden unless ``redact=False``."""
        return {
            "id": self.id,
            "topic": self.topic,
            "tenant": self.tenant,
            "business_group": self.business_group,
            "url": redact_url(self.url) if redact else self.url,
            "http_method": self.http_method,
            "headers": redact_headers(self.headers) if redact else self.headers,
            "active": self.active,
            "created_at": self.created_at,
        }

    def __repr__(self) -> str:  # never shows header values
        target = display_url(self.url) if self.is_webhook else "code"
        state = "" if self.active else " disabled"
        return f"<Subscription {self.id!r} topic={self.topic!r} → {target}{state}>"


Subscription.ITEM_NAMES = frozenset(field.name for field in dataclasses.fields(Subscription))


def new_subscription_values(
    subscription_id: str,
    topic: str,
    *,
    tenant: int | None = None,
    business_group: str | None = None,
    url: str | None = None,
    method: str = DEFAULT_HTTP_METHOD,
    headers: Mapping[str, Any] | None = None,
    active: bool = True,
) -> dict[str, Any]:
    """Validated column values for a new subscription."""
    check_subscription_id(subscription_id)
    check_task_name(topic)
    values: dict[str, Any] = {
        "id": subscription_id,
        "topic": topic,
        "tenant": _check_tenant(tenant),
        "business_group": _check_business_group(business_group),
        "url": check_url(url) if url is not None else None,
        "http_method": check_method(method),
        "headers": check_headers(headers) or None,
        "active": bool(active),
    }
    if values["headers"] and values["url"] is None:
        raise ConfigurationError(
            f"subscription {subscription_id!r} has headers but no url: headers are sent with "
            "webhook calls only; give it a webhook url or drop the headers"
        )
    return values


class SubscriptionChanges(TypedDict, total=False):
    """What ``update_subscription`` may change (None clears tenant, business_group, url and
    headers)."""

    topic: str
    tenant: int | None
    business_group: str | None
    url: str | None
    method: str
    headers: Mapping[str, Any] | None
    active: bool


#: change name → (column, check): each change is validated alone, like a new subscription's.
_CHANGE_CHECKS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "topic": ("topic", check_task_name),
    "tenant": ("tenant", _check_tenant),
    "business_group": ("business_group", _check_business_group),
    "url": ("url", lambda url: None if url is None else check_url(url)),
    "method": ("http_method", check_method),
    "headers": ("headers", lambda headers: check_headers(headers) or None),
    "active": ("active", bool),
}


def changed_values(existing: Subscription, changes: Mapping[str, Any]) -> dict[str, Any]:
    """Validated column values for ``changes`` to ``existing``; the row they make must still
    be one ``new_subscription_values`` would accept (headers need a url)."""
    unknown = sorted(set(changes) - set(_CHANGE_CHECKS))
    if unknown:
        raise TypeError(
            f"update_subscription() got unexpected keyword argument(s) "
            f"{', '.join(map(repr, unknown))}: the changes are {', '.join(_CHANGE_CHECKS)}"
        )
    values = {}
    for name, value in changes.items():
        column, check = _CHANGE_CHECKS[name]
        values[column] = check(value)
    headers = values.get("headers", existing.headers)
    if headers and not values.get("url", existing.url):
        raise ConfigurationError(
            f"subscription {existing.id!r} would have headers but no url: headers are sent "
            "with webhook calls only; keep a webhook url or drop the headers too"
        )
    return values


# ---- SQL ----------------------------------------------------------------------------------
class SubscriptionStore:
    """The subscriptions table (its statements: the catalog's ``subscriptions_*``)."""

    def __init__(self, tables: QueueTables) -> None:
        self.tables = tables
        self.table = tables.subscriptions
        self.names = tables.names

    @staticmethod
    def dialect(conn: Connection) -> dialects.Dialect:
        return dialects.for_sqlalchemy(conn.dialect)

    def add(self, conn: Connection, values: Mapping[str, Any]) -> Subscription:
        with self.translate_errors(conn):
            if self.get(conn, values["id"]) is not None:
                raise _duplicate(values["id"])
            try:
                conn.execute(catalog.subscriptions_add(self.tables, self.dialect(conn), values))
            except sa.exc.IntegrityError:  # added concurrently since the check
                raise _duplicate(values["id"]) from None
            found = self.get(conn, values["id"])
        assert found is not None
        return found

    def get(self, conn: Connection, subscription_id: str) -> Subscription | None:
        with self.translate_errors(conn):
            stmt = catalog.subscriptions_get(self.tables, self.dialect(conn), subscription_id)
            row = conn.execute(stmt)
            first = row.first()
        return Subscription.from_row(first) if first is not None else None

    def find(
        self, conn: Connection, topic: str | None = None, active: bool | None = None
    ) -> list[Subscription]:
        stmt = catalog.subscriptions_find(self.tables, self.dialect(conn), topic, active)
        with self.translate_errors(conn):
            return [Subscription.from_row(row) for row in conn.execute(stmt)]

    def set_active(self, conn: Connection, subscription_id: str, active: bool) -> Subscription:
        return self.update(conn, subscription_id, {"active": active})

    def update(
        self, conn: Connection, subscription_id: str, changes: Mapping[str, Any]
    ) -> Subscription:
        """Apply ``changes`` (see ``SubscriptionChanges``); returns the row as it now is."""
        with self.translate_errors(conn):
            values = changed_values(self.existing(conn, subscription_id), changes)
            if values:
                stmt = catalog.subscriptions_update
                conn.execute(stmt(self.tables, self.dialect(conn), subscription_id, values))
            found = self.get(conn, subscription_id)
        assert found is not None
        return found

    def remove(self, conn: Connection, subscription_id: str) -> Subscription:
        """Delete the subscription; returns the row it was."""
        with self.translate_errors(conn):
            found = self.existing(conn, subscription_id)
            conn.execute(
                catalog.subscriptions_delete(self.tables, self.dialect(conn), subscription_id)
            )
        return found

    def existing(self, conn: Connection, subscription_id: str) -> Subscription:
        """The subscription, or an error naming where to look."""
        found = self.get(conn, subscription_id)
        if found is None:
            raise ConfigurationError(
                f"there is no subscription {subscription_id!r} in {self.names.subscriptions}: "
                "see `dbqueue subscriptions list`"
            )
        return found

    def matching(
        self,
        conn: Connection,
        topic: str,
        tenant: int | None,
        business_group: str | None,
        webhooks_only: bool = False,
    ) -> list[str]:
        """Ids of the active subscriptions a publication reaches, in id order.

        A subscription with a tenant (or business group) receives only publications for that
        tenant (group); one without receives them all. An empty string counts as "none", as a
        row written by hand may hold one.
        """
        stmt = catalog.subscriptions_matching(
            self.tables, self.dialect(conn), topic, tenant, business_group, webhooks_only
        )
        with self.translate_errors(conn):
            return list(conn.execute(stmt).scalars())

    @contextlib.contextmanager
    def translate_errors(self, conn: Connection) -> Iterator[None]:
        """A missing subscriptions table says how to create it."""
        try:
            yield
        except sa.exc.DBAPIError as exc:
            if dialects.for_sqlalchemy(conn.dialect).is_missing_table(exc):
                where = f" in schema {self.names.schema!r}" if self.names.schema else ""
                raise SchemaMissingError(
                    f"the subscriptions table {self.names.subscriptions!r}{where} does not "
                    "exist: run `dbqueue migrate` (with the same URL and table prefix) to "
                    "create or upgrade the queue tables"
                ) from exc
            raise


def _duplicate(subscription_id: str) -> ConfigurationError:
    return ConfigurationError(
        f"subscription {subscription_id!r} already exists: choose another id, or change the "
        f"existing one with `dbqueue subscriptions update|enable|disable {subscription_id}`"
    )


def subscription_problems(
    rows: list[Subscription], subscribers: list[tuple[str, str]]
) -> list[str]:
    """What a worker warns about at start-up: code registered (``subscribers``: topic, id;
    topic ``*`` for any) for a subscription that does not exist or receives another topic,
    and active subscriptions with neither code nor a webhook url, whose deliveries can only
    fail."""
    by_id = {row.id: row for row in rows}
    problems = []
    for topic, subscription_id in subscribers:
        row = by_id.get(subscription_id)
        if row is None:
            shown = "TOPIC" if topic == ANY_TOPIC else topic
            problems.append(
                f"subscriber {subscription_id!r} (topic {topic!r}) is registered, but there is "
                f"no subscription {subscription_id!r}: it receives nothing until one is added "
                f"(dbqueue subscriptions add {subscription_id} --topic {shown})"
            )
        elif topic not in (row.topic, ANY_TOPIC):
            problems.append(
                f"subscriber {subscription_id!r} is registered for topic {topic!r}, but the "
                f"subscription receives topic {row.topic!r}: its deliveries never reach that "
                f"code (register it for {row.topic!r}, or change the subscription with "
                f"`dbqueue subscriptions update {subscription_id} --topic {topic}`)"
            )
    with_code = {subscription_id for _, subscription_id in subscribers}
    problems.extend(
        f"active subscription {row.id!r} (topic {row.topic!r}) has no webhook url and no code "
        f"in this worker: its deliveries fail here (register @app.subscriber({row.topic!r}, "
        f"{row.id!r}), or give it a url: `dbqueue subscriptions update {row.id} "
        "--webhook-url URL`)"
        for row in rows
        if row.active and not row.is_webhook and row.id not in with_code
    )
    return problems


def publication_message(
    topic: str,
    delivered_to: list[str],
    tenant: int | None,
    business_group: str | None,
    webhooks_only: bool,
) -> str:
    """What a publication's own record says: who it went to, or that nobody matched."""
    kind = "webhook subscription" if webhooks_only else "subscription"
    if delivered_to:
        return f"published to {len(delivered_to)} {kind}(s): {', '.join(delivered_to)}"
    filters = []
    if tenant is not None:
        filters.append(f"tenant {tenant}")
    if business_group is not None:
        filters.append(f"business group {business_group!r}")
    where = f" ({', '.join(filters)})" if filters else ""
    return f"no active {kind} matches topic {topic!r}{where}: nothing to deliver"

"""Webhooks without code: a delivery whose subscription has a ``url`` is an HTTP call.

The built-in handler reads the subscription row when the delivery runs (so a corrected url or
header applies to pending retries), sends the payload — as a JSON body for POST and PUT, as the
query string for GET — with the row's method and headers, and judges the answer: a 2xx is
success; any other status, a timeout or a network error is a failed attempt, retried and
dead-lettered like any job's. The call happens while the job's transaction is open (the claim
and the outcome commit together), so it is always bounded by a timeout, and at most
``max_response_bytes`` of the answer are read.

Credentials never leave the request: messages and logs show the URL without its user info and
query string, never show header values, and scrub any secret that a server echoes back.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from sqlalchemy.orm import Session

from dbqueue.base.distribution import installed_version
from dbqueue.base.results import Message
from dbqueue.errors import AttemptFailed, ConfigurationError
from dbqueue.job import Job
from dbqueue.pubsub.subscriptions import (
    Subscription,
    SubscriptionStore,
    check_headers,
    check_method,
    check_url,
    display_url,
    is_secret_header,
)

if TYPE_CHECKING:  # imported when a webhook is sent: worker start-up does not pay for it
    import requests

#: Seconds to wait for a connection and for each answer (the seed's DEFAULT_WEBHOOK_TIMEOUT).
DEFAULT_WEBHOOK_TIMEOUT = 20.0
#: Most bytes of a response body read; the rest is never downloaded.
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024
#: Most characters of the response body quoted in the job's message.
MESSAGE_BODY_CHARS = 1000
_MIN_SECRET_CHARS = 4


def _user_agent() -> str:
    return f"dbqueue/{installed_version() or 'dev'} (webhook)"


class WebhookSender:
    """Sends one delivery to its subscription's URL and says how it went."""

    def __init__(
        self,
        timeout: float = DEFAULT_WEBHOOK_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not 0 < timeout < math.inf
        ):
            raise ConfigurationError(
                f"webhook timeout {timeout!r} must be a positive number of seconds"
            )
        self.timeout = float(timeout)
        self.max_response_bytes = max_response_bytes
        self.user_agent = _user_agent()

    def send(self, subscription: Subscription, job: Job) -> str:
        """Call the webhook; return the success message or raise AttemptFailed."""
        name = subscription.id
        try:
            url = check_url(subscription.url)
            method = check_method(subscription.method)
            configured = check_headers(subscription.headers)
        except ConfigurationError as exc:
            raise AttemptFailed(
                f"subscription {name!r} cannot be called: {exc} (fix its row in the "
                "subscriptions table; the next attempt reads it again)"
            ) from None
        where = f"webhook {method} {display_url(url)}"
        scrub = _Scrubber(url, configured)
        params, data, headers = self._request_parts(method, name, configured, job)
        deadline = time.monotonic() + self.timeout
        import requests

        with requests.Session() as http:
            try:
                response = http.request(
                    method,
                    url,
                    params=params,
                    data=data,
                    headers=headers,
                    timeout=(self.timeout, self.timeout),
                    allow_redirects=False,  # a redirect must not carry the headers elsewhere
                    stream=True,  # read at most max_response_bytes of the body
                )
            except requests.Timeout:
                raise AttemptFailed(
                    f"{where}: no answer within {self.timeout:g} s (the webhook timeout, "
                    "DEFAULT_WEBHOOK_TIMEOUT)"
                ) from None
            except requests.ConnectionError as exc:
                raise AttemptFailed(f"{where}: cannot connect ({network_reason(exc)})") from None
            except (requests.RequestException, ValueError) as exc:
                raise AttemptFailed(
                    f"{where}: the request failed ({type(exc).__name__}: {scrub(str(exc))})"
                ) from None
            with response:
                body, note = self._read_body(response, deadline)
        status = f"{response.status_code} {scrub(response.reason or '')}".strip()
        answer = f"{status}; response: {self._excerpt(response, body, note, scrub)}"
        if 200 <= response.status_code < 300:
            return f"{where}: {answer}"
        hint = ""
        if 300 <= response.status_code < 400:
            hint = " (redirects are not followed: put the final URL in the subscription)"
        raise AttemptFailed(f"{where}: answered {answer}{hint}")

    def _request_parts(
        self, method: str, name: str, configured: dict[str, str], job: Job
    ) -> tuple[dict[str, str] | None, bytes | None, dict[str, str]]:
        """Query parameters (GET) or JSON body, and the headers: dbqueue's, then the
        subscription's own."""
        headers = {
            "User-Agent": self.user_agent,
            # A retry carries the same job id: receivers can use it to drop duplicates.
            "X-Dbqueue-Job": str(job.id),
            "X-Dbqueue-Attempt": str(job.attempt),
            "X-Dbqueue-Subscription": quote(name, safe=""),
        }
        if job.publication_id is not None:
            headers["X-Dbqueue-Publication"] = str(job.publication_id)
        headers.update(configured)
        if method == "GET":
            return query_parameters(job.payload), None, headers
        data = json.dumps(job.payload, ensure_ascii=False, separators=(",", ":")).encode()
        if not any(k.lower() == "content-type" for k in configured):
            headers["Content-Type"] = "application/json; charset=utf-8"
        return None, data, headers

    def _read_body(self, response: requests.Response, deadline: float) -> tuple[bytes, str]:
        """At most max_response_bytes, and nothing after the deadline: the status already
        decided the outcome, the body is only quoted in the message."""
        chunks: list[bytes] = []
        size = 0
        note = ""
        import requests

        try:
            for chunk in response.iter_content(chunk_size=8192):
                chunks.append(chunk)
                size += len(chunk)
                if size >= self.max_response_bytes:
                    note = f" [only the first {self.max_response_bytes} bytes were read]"
                    break
                if time.monotonic() >= deadline:
                    note = " [the rest did not arrive within the timeout]"
                    break
        except requests.RequestException:
            note = " [the body was cut off]"
        return b"".join(chunks)[: self.max_response_bytes], note

    @staticmethod
    def _excerpt(response: requests.Response, body: bytes, note: str, scrub: _Scrubber) -> str:
        text = body.decode(response.encoding or "utf-8", errors="replace").strip()
        if not text:
            return "(empty)" + note
        if len(text) > MESSAGE_BODY_CHARS:
            text = text[:MESSAGE_BODY_CHARS] + "…[truncated]"
        return scrub(text) + note


class WebhookHandler:
    """The handler a worker runs for a delivery that no code is registered for."""

    def __init__(self, store: SubscriptionStore, sender: WebhookSender) -> None:
        self.store = store
        self.sender = sender

    def __call__(self, job: Job, session: Session) -> Message:
        subscription_id = job.subscription_id
        assert subscription_id is not None
        subscription = self.store.get(session.connection(), subscription_id)
        if subscription is None:
            raise AttemptFailed(
                f"subscription {subscription_id!r} (topic {job.task!r}) no longer exists in "
                f"{self.store.names.subscriptions}: nothing to deliver to; the delivery is "
                "retried in case it is added back"
            )
        if not subscription.is_webhook:
            raise AttemptFailed(
                f"no subscriber is registered for subscription {subscription_id!r} of topic "
                f"{job.task!r} in this worker, and it has no webhook url: add "
                f"@app.subscriber({job.task!r}, {subscription_id!r}) to the worker's app, or "
                "give the subscription a url"
            )
        if not subscription.active:
            raise AttemptFailed(
                f"subscription {subscription_id!r} is disabled: not called. Enable it "
                f"(`dbqueue subscriptions enable {subscription_id}`) and this delivery goes "
                "out on its next attempt"
            )
        # The call's outcome (status, an excerpt of the answer) is a line for people: the
        # job's message, not a result.
        return Message(self.sender.send(subscription, job))


def query_parameters(payload: Any) -> dict[str, str] | None:
    """A GET's query string: a JSON object's keys, scalars as text and the rest as JSON;
    any other payload as ``payload=<JSON>``."""
    if payload is None:
        return None
    if not isinstance(payload, Mapping):
        return {"payload": _json(payload)}
    params = {}
    for key, value in payload.items():
        if value is None:
            params[str(key)] = ""
        elif isinstance(value, bool):
            params[str(key)] = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            params[str(key)] = str(value)
        else:
            params[str(key)] = _json(value)
    return params


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def network_reason(exc: BaseException) -> str:
    """The operating system's reason for a network error (e.g. "[Errno 111] Connection
    refused"), found down the exception chain; never the request URL, which the outer
    exceptions print with its query string."""
    found: OSError | None = None
    stack: list[BaseException] = [exc]
    seen: set[int] = set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            found = current
        nested = [getattr(current, "reason", None), current.__cause__, current.__context__]
        nested += [a for a in current.args if isinstance(a, BaseException)]
        stack.extend(e for e in nested if isinstance(e, BaseException))
    if found is None:
        return type(exc).__name__
    errno = f"[Errno {found.errno}] " if found.errno is not None else ""
    return f"{type(found).__name__}: {errno}{found.strerror}"


class _Scrubber:
    """Replaces credentials that might be echoed in a server's answer with ``***``."""

    def __init__(self, url: str, headers: Mapping[str, str]) -> None:
        secrets = set()
        for name, value in headers.items():
            if is_secret_header(name):
                secrets.add(value)
                secrets.update(value.split())  # "Bearer <token>": the token alone too
        parts = urlsplit(url)
        secrets.update(filter(None, (parts.password, parts.username, parts.query)))
        for pair in parts.query.split("&"):
            secrets.add(pair.partition("=")[2])
        self.secrets = sorted(
            (s for s in secrets if len(s) >= _MIN_SECRET_CHARS), key=len, reverse=True
        )

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

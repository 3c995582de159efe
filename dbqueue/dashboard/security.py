"""Who may act: the access token and the CSRF check every action (a POST) passes.

CSRF: a random value in a ``SameSite=Strict`` cookie that every form repeats in a hidden
field (double submit); a POST whose field does not match the cookie, or whose ``Origin`` names
another host, is refused. Token: when the dashboard has one, every request must carry it
(``Authorization: Bearer …``, or the cookie the login form sets, an HMAC of the token, never
the token itself); without one, actions are allowed only when ``actions_without_token`` says
the place is trusted (``dbqueue dashboard`` bound to loopback).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

CSRF_COOKIE = "dbqueue_csrf"
CSRF_FIELD = "csrf"
AUTH_COOKIE = "dbqueue_auth"


@dataclass(frozen=True)
class Access:
    token: str | None = None
    read_only: bool = False
    actions_without_token: bool = False

    @property
    def actions(self) -> bool:
        """Whether action forms exist at all (read-only removes them)."""
        return not self.read_only and (self.token is not None or self.actions_without_token)

    def cookie_value(self) -> str:
        assert self.token is not None
        return hmac.new(self.token.encode(), b"dbqueue-dashboard", hashlib.sha256).hexdigest()

    def authorised(self, headers: dict[str, str], cookies: dict[str, str]) -> bool:
        if self.token is None:
            return True
        bearer = headers.get("authorization", "")
        if bearer.startswith("Bearer ") and hmac.compare_digest(
            bearer[7:].encode(), self.token.encode()
        ):
            return True
        return hmac.compare_digest(
            cookies.get(AUTH_COOKIE, "").encode(), self.cookie_value().encode()
        )

    def token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())


def new_csrf() -> str:
    return secrets.token_urlsafe(32)


def csrf_ok(form_value: str, cookie_value: str, origin: str | None, host: str | None) -> bool:
    if not cookie_value or not hmac.compare_digest(form_value.encode(), cookie_value.encode()):
        return False
    if origin and origin != "null" and host:
        return urlsplit(origin).netloc == host
    return True

"""The seed's multi-database credentials API: an OAuth token (password grant), then the
tenant's database credentials, which become a SQLAlchemy URL.

Secrets (the account's password, the token, the database password) never reach a message or a
log line: errors name the URL, the HTTP status and the OAuth error code, never a body that
could echo them. The token is cached until it expires (less a margin) and fetched again once
when the credentials API answers 401 (revoked or expired early).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import sqlalchemy as sa

from dbqueue.config import Settings
from dbqueue.errors import ConfigurationError

if TYPE_CHECKING:  # imported when the API is used: worker start-up does not pay for it
    import requests

DEFAULT_CREDENTIALS_URL = "https://api.sre.nasajon.com.br/erp/credentials"
DEFAULT_TOKEN_URL = "https://auth.nasajon.com.br/auth/realms/master/protocol/openid-connect/token"
#: The tenant databases of the seed's ERP are PostgreSQL.
DEFAULT_DRIVER = "postgresql+psycopg2"
#: A token is renewed this long before it expires, so a request never carries a stale one.
EXPIRY_MARGIN = 30.0
#: Used when the token response has no expires_in.
DEFAULT_TOKEN_SECONDS = 300.0
TIMEOUT = 10.0

# Accepted spellings of each field of the credentials response (English and the seed's).
_FIELDS = {
    "host": ("host", "hostname", "server", "db_host"),
    "port": ("port", "db_port", "porta"),
    "database": ("database", "dbname", "db_name", "base", "db_base", "banco"),
    "username": ("user", "username", "db_user", "usuario"),
    "password": ("password", "pass", "db_pass", "senha"),
    "driver": ("driver", "dialect"),
}


class CredentialsError(Exception):
    """Why a tenant's credentials could not be had (the message holds no secret)."""


@dataclass
class _Token:
    value: str
    expires_at: float


class CredentialsAPI:
    """Tenant → database URL through the seed's API (``MULTI_DATABASE=true``)."""

    def __init__(
        self,
        *,
        user: str,
        password: str,
        client_id: str,
        credentials_url: str = DEFAULT_CREDENTIALS_URL,
        token_url: str = DEFAULT_TOKEN_URL,
        timeout: float = TIMEOUT,
    ) -> None:
        self.user = user
        self._password = password
        self.client_id = client_id
        self.credentials_url = credentials_url
        self.token_url = token_url
        self.timeout = timeout
        self._token: _Token | None = None
        self._lock = threading.Lock()
        import requests

        self._http = requests.Session()
        #: Tokens fetched so far (a figure for tests and logs).
        self.tokens_fetched = 0

    def __repr__(self) -> str:
        return f"CredentialsAPI(user={self.user!r}, credentials_url={self.credentials_url!r})"

    @classmethod
    def from_settings(cls, settings: Settings) -> CredentialsAPI:
        missing = [
            name
            for name, value in (
                ("MULTI_DATABASE_USER", settings.multi_database_user),
                ("MULTI_DATABASE_PASSWORD", settings.multi_database_password),
                ("MULTI_DATABASE_CLIENT_ID", settings.multi_database_client_id),
            )
            if not value
        ]
        if missing:
            raise ConfigurationError(
                f"MULTI_DATABASE=true needs {', '.join(missing)}: set them to the account and "
                "client id that may read the tenants' database credentials"
            )
        return cls(
            user=settings.multi_database_user or "",
            password=settings.multi_database_password or "",
            client_id=settings.multi_database_client_id or "",
            credentials_url=settings.multi_database_credentials_url or DEFAULT_CREDENTIALS_URL,
            token_url=settings.oauth_token_url or DEFAULT_TOKEN_URL,
        )

    def __call__(self, tenant: Any) -> sa.engine.URL:
        return self.url_for(tenant)

    def url_for(self, tenant: Any) -> sa.engine.URL:
        """The tenant's database URL; CredentialsError saying why not."""
        token = self._current_token()
        response = self._ask(tenant, token)
        if response.status_code == 401:  # revoked or expired early: one fresh token, once
            self._drop(token)
            response = self._ask(tenant, self._current_token())
            if response.status_code == 401:
                raise CredentialsError(
                    f"the credentials API {self.credentials_url} refused the token (HTTP 401) "
                    "twice, a fresh one included: check that MULTI_DATABASE_USER may read "
                    "database credentials"
                )
        if response.status_code == 404:
            raise CredentialsError(
                f"the credentials API {self.credentials_url} does not know tenant {tenant!r} "
                "(HTTP 404)"
            )
        if not 200 <= response.status_code < 300:
            raise CredentialsError(
                f"the credentials API {self.credentials_url} answered HTTP "
                f"{response.status_code} for tenant {tenant!r}"
            )
        try:
            body = response.json()
        except ValueError:
            raise CredentialsError(
                f"the credentials API {self.credentials_url} answered tenant {tenant!r} with "
                "something that is not JSON"
            ) from None
        return credentials_url(body, tenant)

    # ---- the token ------------------------------------------------------------------------
    def _current_token(self) -> _Token:
        with self._lock:
            token = self._token
            if token is None or time.monotonic() >= token.expires_at:
                token = self._token = self._fetch_token()
            return token

    def _drop(self, token: _Token) -> None:
        with self._lock:
            if self._token is token:
                self._token = None

    def _fetch_token(self) -> _Token:
        form = {
            "grant_type": "password",
            "client_id": self.client_id,
            "username": self.user,
            "password": self._password,
        }
        import requests

        try:
            response = self._http.post(self.token_url, data=form, timeout=self.timeout)
        except requests.RequestException as exc:
            raise CredentialsError(
                f"cannot reach the OAuth token endpoint {self.token_url} ({type(exc).__name__})"
            ) from None
        if response.status_code != 200:
            raise CredentialsError(
                f"the OAuth token endpoint {self.token_url} refused a token to "
                f"MULTI_DATABASE_USER {self.user!r} (HTTP {response.status_code}"
                f"{_oauth_error(response)}): check MULTI_DATABASE_USER, MULTI_DATABASE_PASSWORD "
                "and MULTI_DATABASE_CLIENT_ID"
            )
        try:
            body = response.json()
            value = str(body["access_token"])
            seconds = float(body.get("expires_in") or DEFAULT_TOKEN_SECONDS)
        except (ValueError, KeyError, TypeError):
            raise CredentialsError(
                f"the OAuth token endpoint {self.token_url} answered without an access_token"
            ) from None
        self.tokens_fetched += 1
        lifetime = max(seconds - EXPIRY_MARGIN, seconds / 2)
        return _Token(value, time.monotonic() + lifetime)

    def _ask(self, tenant: Any, token: _Token) -> requests.Response:
        url = self.credentials_url
        params = None
        if "{tenant}" in url:
            url = url.replace("{tenant}", quote(str(tenant), safe=""))
        else:
            params = {"tenant": str(tenant)}
        headers = {"Authorization": f"Bearer {token.value}", "Accept": "application/json"}
        import requests

        try:
            return self._http.get(url, params=params, headers=headers, timeout=self.timeout)
        except requests.RequestException as exc:
            raise CredentialsError(
                f"cannot reach the credentials API {self.credentials_url} for tenant "
                f"{tenant!r} ({type(exc).__name__})"
            ) from None


def _oauth_error(response: requests.Response) -> str:
    """The OAuth error code and description (RFC 6749 5.2): they name no secret."""
    try:
        body = response.json()
    except ValueError:
        return ""
    if not isinstance(body, Mapping) or "error" not in body:
        return ""
    described = str(body.get("error_description") or "")[:120]
    return f": {str(body['error'])[:60]}" + (f", {described}" if described else "")


def credentials_url(body: Any, tenant: Any) -> sa.engine.URL:
    """The credentials response as a URL: a ``url`` field, else host, port, database, user,
    password (and an optional driver, default PostgreSQL), in any of their accepted spellings;
    a ``data``/``credentials`` envelope is opened first."""
    if isinstance(body, Mapping):
        for envelope in ("data", "credentials"):
            if isinstance(body.get(envelope), Mapping):
                body = body[envelope]
    if not isinstance(body, Mapping):
        raise CredentialsError(f"the credentials of tenant {tenant!r} are not a JSON object")
    if isinstance(body.get("url"), str):
        try:
            return sa.engine.make_url(body["url"])
        except (sa.exc.ArgumentError, ValueError):
            raise CredentialsError(
                f"the credentials of tenant {tenant!r} hold a url that is not a database URL"
            ) from None
    found = {
        key: next((body[n] for n in names if body.get(n)), None) for key, names in _FIELDS.items()
    }
    missing = [key for key in ("host", "database", "username") if found[key] is None]
    if missing:
        raise CredentialsError(
            f"the credentials of tenant {tenant!r} lack {', '.join(missing)} (fields found: "
            f"{', '.join(sorted(str(k) for k in body)) or 'none'})"
        )
    try:
        port = int(found["port"]) if found["port"] is not None else None
    except (TypeError, ValueError):
        raise CredentialsError(f"the credentials of tenant {tenant!r} have a bad port") from None
    return sa.engine.URL.create(
        str(found["driver"] or DEFAULT_DRIVER),
        username=str(found["username"]),
        password=None if found["password"] is None else str(found["password"]),
        host=str(found["host"]),
        port=port,
        database=str(found["database"]),
    )

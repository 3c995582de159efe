"""The seed's multi-database mode (MULTI_DATABASE=true): a real local HTTP server plays the OAuth
token endpoint and the credentials API; the tenants' databases are real (PostgreSQL, MariaDB).
The token is cached and refreshed once on a 401; a refused token and an unknown tenant are clear
failed attempts; no secret reaches a job's message or a log line."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs

import pytest
import sqlalchemy as sa
from support.http_server import Recorded, RecordingServer
from support.tenant_dbs import BASE, mysql_databases, notes, postgresql_databases, rows

import dbqueue
from dbqueue.errors import ConfigurationError
from dbqueue.migrations import migrate

PASSWORD = "s3cret-account-password"
DB_PASSWORD = "db-password-never-logged"
PG, MARIA = f"{BASE}tenant_1", f"{BASE}tenant_3"


class CredentialsService:
    """/token (password grant) and /credentials?tenant=N (Bearer token)."""

    def __init__(self, server: RecordingServer, databases: dict[int, str]) -> None:
        self.databases = databases  # tenant → URL of its database
        self.valid: set[str] = set()
        self.issued = 0
        self.refuse = False
        server.routes["/token"] = self.token
        server.routes["/credentials"] = self.credentials

    def token(self, request: Recorded) -> tuple[int, bytes]:
        form = {k: v[0] for k, v in parse_qs(request.body.decode()).items()}
        if self.refuse or form != {
            "grant_type": "password",
            "client_id": "erp-worker",
            "username": "robot@example.com",
            "password": PASSWORD,
        }:
            body = {"error": "invalid_grant", "error_description": "Invalid user credentials"}
            return 401, json.dumps(body).encode()
        self.issued += 1
        token = f"token-{self.issued}"
        self.valid.add(token)
        return 200, json.dumps({"access_token": token, "expires_in": 300}).encode()

    def revoke_all(self) -> None:
        self.valid.clear()

    def credentials(self, request: Recorded) -> tuple[int, bytes]:
        if request.headers.get("Authorization", "").removeprefix("Bearer ") not in self.valid:
            return 401, b'{"error": "invalid token"}'
        tenant = int(request.query["tenant"][0])
        if tenant not in self.databases:
            return 404, b'{"error": "no such tenant"}'
        url = sa.engine.make_url(self.databases[tenant])
        body = {
            "host": url.host,
            "port": url.port,
            "database": url.database,
            "user": url.username,
            # PostgreSQL trusts local users whatever the password; MariaDB's root has none.
            "password": DB_PASSWORD if url.get_backend_name() == "postgresql" else "",
            "driver": url.drivername,
        }
        return 200, json.dumps(body).encode()


@pytest.fixture
def service() -> Iterator[tuple[CredentialsService, RecordingServer]]:
    server = RecordingServer()
    databases = {**postgresql_databases([PG]), **mysql_databases([MARIA])}
    yield CredentialsService(server, {1: databases[PG], 3: databases[MARIA]}), server
    server.close()


def environ(server: RecordingServer, **extra: str) -> dict[str, str]:
    return {
        "MULTI_DATABASE": "true",
        "MULTI_DATABASE_USER": "robot@example.com",
        "MULTI_DATABASE_PASSWORD": PASSWORD,
        "MULTI_DATABASE_CLIENT_ID": "erp-worker",
        "MULTI_DATABASE_API_CREDETIALS_URL": server.url("/credentials"),
        "OAUTH_TOKEN_URL": server.url("/token"),
        **extra,
    }


def _app(server: RecordingServer, **options: Any) -> dbqueue.App:
    return dbqueue.App(
        "sqlite:///" + options.pop("path"),
        environ=environ(server),
        backoff=lambda attempt: 0.0,
        **options,
    )


def _run(app: dbqueue.App) -> dbqueue.WorkerSummary:
    return app.run_worker(burst=True, poll_interval=0.02, install_signal_handlers=False)


def _secrets_absent(texts: list[str]) -> None:
    for text in texts:
        for secret in (PASSWORD, DB_PASSWORD, "token-1", "token-2"):
            assert secret not in text, f"{secret!r} leaked into {text!r}"


def _prepared(tmp_path, server: RecordingServer, **options: Any) -> dbqueue.App:
    app = _app(server, path=str(tmp_path / "queue.db"), **options)
    migrate.upgrade(app.engine, app.names)

    @app.task("note", tenant_database=True)
    def note(job, session, tenant_session):
        tenant_session.execute(
            notes.insert().values(job_id=job.id, tenant=str(job.tenant), attempt=job.attempt)
        )
        return f"noted for tenant {job.tenant}"

    return app


def _messages(app: dbqueue.App) -> dict[int, tuple[str, str]]:
    with app.engine.connect() as conn:
        jobs = app.tables.jobs
        found = conn.execute(sa.select(jobs.c.id, jobs.c.status, jobs.c.message))
        return {row.id: (row.status, row.message or "") for row in found}


def test_the_credentials_api_opens_each_tenants_database(tmp_path, service, caplog):
    api, server = service
    app = _prepared(tmp_path, server)
    first = [app.enqueue(None, "note", {}, tenant=t) for t in (1, 3)]
    api.revoke_all()  # no token issued yet: nothing changes
    with caplog.at_level(logging.DEBUG):
        summary = _run(app)
    assert (summary.succeeded, summary.failed) == (2, 0)
    assert rows(api.databases[1]) == [(first[0], "1", 1)]
    assert rows(api.databases[3]) == [(first[1], "3", 1)]
    # One token for both tenants; the credentials asked once per tenant (engines cached).
    assert api.issued == 1
    assert len(server.received("/credentials")) == 2

    # The token is revoked: the next tenant's credentials get a 401, a new token, and work.
    api.revoke_all()
    app.context.tenants.dispose()
    second = app.enqueue(None, "note", {}, tenant=1)
    summary = _run(app)
    assert (summary.succeeded, summary.failed) == (1, 0)
    assert api.issued == 2
    assert [r[0] for r in rows(api.databases[1])] == [first[0], second]
    messages = _messages(app)
    _secrets_absent([m for _, m in messages.values()] + [r.getMessage() for r in caplog.records])


def test_a_refused_token_and_an_unknown_tenant_are_clear_failed_attempts(tmp_path, service, caplog):
    api, server = service
    app = _prepared(tmp_path, server, max_attempts=2)
    api.refuse = True
    refused = app.enqueue(None, "note", {}, tenant=1)
    with caplog.at_level(logging.DEBUG):
        summary = _run(app)
    assert (summary.succeeded, summary.failed) == (0, 2)
    status, message = _messages(app)[refused]
    assert status == "dead"
    assert message.startswith(f"tenant 1 (job {refused}): the OAuth token endpoint ")
    assert "refused a token to MULTI_DATABASE_USER 'robot@example.com' (HTTP 401: " in message
    assert "invalid_grant, Invalid user credentials" in message

    api.refuse = False
    unknown = app.enqueue(None, "note", {}, tenant=42)
    summary = _run(app)
    assert (summary.succeeded, summary.failed) == (0, 2)
    status, message = _messages(app)[unknown]
    assert status == "dead"
    assert message.startswith(f"tenant 42 (job {unknown}): the credentials API ")
    assert message.endswith("does not know tenant 42 (HTTP 404)")
    _secrets_absent(
        [m for _, m in _messages(app).values()] + [r.getMessage() for r in caplog.records]
    )


def test_multi_database_needs_its_account():
    with pytest.raises(ConfigurationError, match="MULTI_DATABASE=true needs MULTI_DATABASE_PASS"):
        dbqueue.App(
            "sqlite://",
            environ={
                "MULTI_DATABASE": "true",
                "MULTI_DATABASE_USER": "robot",
                "MULTI_DATABASE_CLIENT_ID": "x",
            },
        )
    settings = dbqueue.App("sqlite://", environ={"MULTI_DATABASE_PASSWORD": PASSWORD}).settings
    assert PASSWORD not in repr(settings)

"""Webhooks without code, against a real HTTP server on 127.0.0.1 started by each test.

Timing never decides a test: a slow endpoint answers after 3 s (or when the test ends) while the
webhook timeout is 0.5 s, and every assertion reads recorded job rows and recorded requests.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from support.http_server import RecordingServer, closed_port

import dbqueue
from dbqueue import QueueClient
from dbqueue.pubsub.webhooks import DEFAULT_MAX_RESPONSE_BYTES

SECRET_TOKEN = "s3cr3t-bearer-value"
SECRET_QUERY = "query-secret-123"
SECRET_KEY = "api-key-secret-456"


@pytest.fixture
def server() -> Iterator[RecordingServer]:
    http = RecordingServer()
    try:
        yield http
    finally:
        http.close()


def make_due(app, job_id: int) -> None:
    jobs = app.tables.jobs
    with app.engine.begin() as conn:
        conn.execute(jobs.update().where(jobs.c.id == job_id).values(run_at=jobs.c.created_at))


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in (SECRET_TOKEN, SECRET_QUERY, SECRET_KEY):
            assert secret not in (text or ""), f"{secret!r} leaked into: {text!r}"


def test_webhooks_arrive_with_the_configured_method_headers_and_body(backend, server):
    app = backend.app()
    app.add_subscription(
        None,
        "post_hook",
        "order.paid",
        url=server.url("/ok?source=dbqueue"),
        headers={"Authorization": f"Bearer {SECRET_TOKEN}", "X-Custom": "yes"},
    )
    app.add_subscription(
        None,
        "put_hook",
        "order.paid",
        url=server.url("/ok"),
        method="PUT",
        headers={"Content-Type": "application/vnd.orders+json"},
    )
    app.add_subscription(None, "get_hook", "order.paid", url=server.url("/ok"), method="get")
    app.add_subscription(None, "code_sub", "order.paid")

    @app.subscriber("order.paid", "code_sub")
    def code_sub(job, session):
        return "code ran, no HTTP"

    payload = {"order": 42, "paid": True, "lines": [1, 2], "note": "olá", "coupon": None}
    publication_id = app.publish(None, "order.paid", payload, tenant=3)
    backend.run_worker(app)

    reached = backend.deliveries(publication_id)
    assert {k: j["status"] for k, j in reached.items()} == dict.fromkeys(reached, "succeeded")
    assert reached["code_sub"]["result"] == "code ran, no HTTP"
    assert reached["post_hook"]["result"] is None  # a webhook's outcome is its message
    by_method = {r.method: r for r in server.requests}
    assert sorted(by_method) == ["GET", "POST", "PUT"] and len(server.requests) == 3

    post = by_method["POST"]
    assert post.path == "/ok" and post.query == {"source": ["dbqueue"]}
    assert post.headers["Authorization"] == f"Bearer {SECRET_TOKEN}"
    assert post.headers["X-Custom"] == "yes"
    assert post.headers["Content-Type"] == "application/json; charset=utf-8"
    assert json.loads(post.body) == payload
    assert post.headers["X-Dbqueue-Job"] == str(reached["post_hook"]["id"])
    assert post.headers["X-Dbqueue-Attempt"] == "1"
    assert post.headers["X-Dbqueue-Publication"] == str(publication_id)
    assert post.headers["X-Dbqueue-Subscription"] == "post_hook"
    assert post.headers["User-Agent"].startswith("dbqueue/")

    put = by_method["PUT"]
    assert put.headers["Content-Type"] == "application/vnd.orders+json"
    assert json.loads(put.body) == payload

    get = by_method["GET"]
    assert get.body == b""
    assert get.query == {
        "order": ["42"],
        "paid": ["true"],
        "lines": ["[1,2]"],
        "note": ["olá"],
        "coupon": [""],
    }

    port = server.httpd.server_address[1]
    assert reached["post_hook"]["message"] == (
        f"webhook POST http://127.0.0.1:{port}/ok?…: 200 OK; response: accepted"
    )
    assert reached["get_hook"]["message"].startswith(f"webhook GET http://127.0.0.1:{port}/ok:")
    assert_no_secret(*(j["message"] for j in backend.jobs()))


def test_500_timeout_and_closed_port_are_failed_attempts_retried_then_dead(backend, server, caplog):
    app = backend.app(retry_base_interval=0.01, webhook_timeout=0.5)
    secret_headers = {"Authorization": f"Bearer {SECRET_TOKEN}", "X-Api-Key": SECRET_KEY}
    for name, url in (
        ("erroring", server.url(f"/fail?token={SECRET_QUERY}")),
        ("slow", server.url("/slow")),
        ("closed", f"http://127.0.0.1:{closed_port()}/hook?token={SECRET_QUERY}"),
    ):
        app.add_subscription(None, name, "invoice.sent", url=url, headers=secret_headers)
    dead_letters = []

    @app.dead_subscriber("invoice.sent", "erroring")
    def erroring_died(job, session):
        dead_letters.append((job.live_id, job.payload))
        return "alerted the on-call"

    with caplog.at_level(logging.DEBUG, logger="dbqueue"):
        publication_id = app.publish(None, "invoice.sent", {"invoice": 7}, max_attempts=2)
        app.run_worker(
            strategy=backend.strategy, burst=True, install_signal_handlers=False, max_jobs=3
        )
        first = backend.deliveries(publication_id)
        assert {k: (j["status"], j["attempt"]) for k, j in first.items()} == {
            "erroring": ("available", 1),
            "slow": ("available", 1),
            "closed": ("available", 1),
        }
        port = server.httpd.server_address[1]
        erroring = first["erroring"]["message"]
        assert erroring.startswith(
            f"webhook POST http://127.0.0.1:{port}/fail?…: answered 500 Internal Server Error; "
            "response: boom: you sent ***; xxxx"
        )
        assert erroring.endswith("…[truncated]") and len(erroring) < 1200
        assert first["slow"]["message"] == (
            f"webhook POST http://127.0.0.1:{port}/slow: no answer within 0.5 s "
            "(the webhook timeout, DEFAULT_WEBHOOK_TIMEOUT)"
        )
        assert (
            "cannot connect (ConnectionRefusedError: [Errno 111] Connection refused)"
            in (first["closed"]["message"])
        )
        assert all(j["previous_status"] == "failed" for j in first.values())
        assert len(server.received("/fail")) == len(server.received("/slow")) == 1

        backend.drain(app)
    final = backend.deliveries(publication_id)
    assert {k: (j["status"], j["attempt"]) for k, j in final.items()} == {
        "erroring": ("dead", 2),
        "slow": ("dead", 2),
        "closed": ("dead", 2),
    }
    assert len(server.received("/fail")) == len(server.received("/slow")) == 2
    assert dead_letters == [(final["erroring"]["id"], {"invoice": 7})]
    (dead_letter,) = [j for j in backend.jobs() if j["dead"]]
    assert (dead_letter["status"], dead_letter["result"]) == ("succeeded", "alerted the on-call")

    messages = [j["message"] for j in backend.jobs()]
    messages += [j["previous_message"] for j in backend.jobs()]
    assert_no_secret(*messages, caplog.text)
    assert "webhook POST" in caplog.text  # the failures were logged, without the secrets


def test_publish_webhook_reaches_only_webhook_subscriptions(database, server):
    app = database.app()
    app.add_subscription(None, "code_only", "stock.low")
    app.add_subscription(None, "hook", "stock.low", url=server.url("/ok"))
    app.add_subscription(None, "hook_t2", "stock.low", url=server.url("/ok"), tenant=2)

    publication_id = app.publish_webhook(None, "stock.low", {"sku": "A"}, tenant=1)
    assert sorted(database.deliveries(publication_id)) == ["hook"]
    assert app.get_job(publication_id)["message"] == "published to 1 webhook subscription(s): hook"

    with app.engine.connect() as conn, conn.begin():
        seed = QueueClient(conn, app=app).insert_task_webhook(
            "erp", "crm", "stock.low", "sku-B", {"sku": "B"}, tenant=2, grupo_empresarial="g"
        )
    assert sorted(database.deliveries(seed)) == ["hook", "hook_t2"]

    nobody = app.publish_webhook(None, "no.hooks.here", {})
    assert app.get_job(nobody)["message"] == (
        "no active webhook subscription matches topic 'no.hooks.here': nothing to deliver"
    )
    database.run_worker(app)
    assert sorted(json.loads(r.body)["sku"] for r in server.requests) == ["A", "B", "B"]


def test_only_the_first_bytes_of_a_large_answer_are_read(database, server):
    app = database.app()
    app.add_subscription(None, "huge", "report.ready", url=server.url("/huge"))
    publication_id = app.publish(None, "report.ready", {})
    database.run_worker(app)
    job = database.deliveries(publication_id)["huge"]
    assert job["status"] == "succeeded"
    assert f"[only the first {DEFAULT_MAX_RESPONSE_BYTES} bytes were read]" in job["message"]
    assert len(job["message"]) < 1500


def test_redirects_are_not_followed(database, server):
    app = database.app(retry_base_interval=60)
    app.add_subscription(
        None, "moved", "user.created", url=server.url("/redirect"), headers={"Cookie": "c=1"}
    )
    publication_id = app.publish(None, "user.created", {})
    database.run_worker(app)
    job = database.deliveries(publication_id)["moved"]
    assert (job["status"], job["attempt"]) == ("available", 1)
    assert "answered 302 Found" in job["message"]
    assert "redirects are not followed" in job["message"]
    assert [r.path for r in server.requests] == ["/redirect"]


def test_a_disabled_subscription_holds_its_pending_deliveries(database, server):
    app = database.app(retry_base_interval=60)
    app.add_subscription(None, "paused", "order.shipped", url=server.url("/ok"))
    publication_id = app.publish(None, "order.shipped", {"order": 5})
    app.disable_subscription(None, "paused")

    database.run_worker(app)
    job = database.deliveries(publication_id)["paused"]
    assert (job["status"], job["attempt"]) == ("available", 1)
    assert job["message"].startswith("subscription 'paused' is disabled: not called")
    assert server.requests == []

    app.enable_subscription(None, "paused")
    make_due(app, job["id"])
    database.run_worker(app)
    job = database.deliveries(publication_id)["paused"]
    assert (job["status"], job["attempt"]) == ("succeeded", 2)
    assert [json.loads(r.body) for r in server.requests] == [{"order": 5}]


def test_the_subscription_row_is_read_when_the_delivery_runs(database, server):
    app = database.app(retry_base_interval=60)
    app.add_subscription(None, "fixable", "invoice.due", url=f"http://127.0.0.1:{closed_port()}/")
    publication_id = app.publish(None, "invoice.due", {"n": 1})
    subscriptions = app.tables.subscriptions

    def set_row(**values):
        with app.engine.begin() as conn:
            conn.execute(
                sa.update(subscriptions).where(subscriptions.c.id == "fixable").values(values)
            )

    def attempt() -> dict:
        job = database.deliveries(publication_id)["fixable"]
        make_due(app, job["id"])
        database.run_worker(app)
        return database.deliveries(publication_id)["fixable"]

    job = attempt()
    assert "cannot connect" in job["message"] and job["attempt"] == 1

    set_row(url=server.url("/ok"), http_method="DELETE")
    job = attempt()
    assert job["message"].startswith("subscription 'fixable' cannot be called: http method")

    set_row(http_method=None, headers=["not", "an", "object"])
    job = attempt()
    assert "headers must be a JSON object" in job["message"]

    set_row(headers={"X-Fixed": "yes"})
    job = attempt()
    assert (job["status"], job["attempt"]) == ("succeeded", 4)
    (request,) = server.requests
    assert (request.method, request.headers["X-Fixed"]) == ("POST", "yes")  # NULL method: POST

    with app.engine.begin() as conn:
        conn.execute(sa.delete(subscriptions).where(subscriptions.c.id == "fixable"))
    app.add_subscription(None, "gone", "invoice.due", url=server.url("/ok"))
    second = app.publish(None, "invoice.due", {"n": 2})
    with app.engine.begin() as conn:
        conn.execute(sa.delete(subscriptions).where(subscriptions.c.id == "gone"))
    database.run_worker(app)
    job = database.deliveries(second)["gone"]
    assert job["status"] == "available"
    assert job["message"].startswith("subscription 'gone' (topic 'invoice.due') no longer exists")


def test_the_webhook_timeout_setting():
    assert dbqueue.DEFAULT_WEBHOOK_TIMEOUT == 20.0
    assert dbqueue.App("sqlite://", environ={}).webhook_sender.timeout == 20.0
    env = {"DEFAULT_WEBHOOK_TIMEOUT": "2.5"}
    assert dbqueue.App("sqlite://", environ=env).webhook_sender.timeout == 2.5
    assert dbqueue.App("sqlite://", environ=env, webhook_timeout=1).webhook_sender.timeout == 1.0
    with pytest.raises(dbqueue.ConfigurationError, match="DEFAULT_WEBHOOK_TIMEOUT"):
        dbqueue.App("sqlite://", environ={"DEFAULT_WEBHOOK_TIMEOUT": "soon"})
    with pytest.raises(dbqueue.ConfigurationError, match="webhook timeout"):
        dbqueue.App("sqlite://", environ={}, webhook_timeout=0)

"""Pub/sub fan-out on every backend: one independent job per matching active subscription."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from support.backends import effects

import dbqueue
from dbqueue import DeadSubscriber, QueueClient, Subscriber, WorkerPubSubBase


def test_one_failing_subscriber_never_reruns_or_blocks_another(backend):
    app = backend.app(retry_base_interval=0.01)
    app.add_subscription(None, "index", "order.paid")
    app.add_subscription(None, "erp", "order.paid")
    runs: dict[str, list] = {"index": [], "erp": [], "erp_dead": []}

    @app.subscriber("order.paid", "index")
    def update_index(job, session):
        runs["index"].append(job.attempt)
        session.execute(effects.insert().values(job_id=job.id, note="indexed"))
        return f"indexed order {job.payload['order']}"

    @app.subscriber("order.paid", "erp", max_attempts=3)
    def call_erp(job, session):
        runs["erp"].append(job.attempt)
        session.execute(effects.insert().values(job_id=job.id, note="rolled back"))
        raise ConnectionError(f"ERP down (attempt {job.attempt})")

    @app.dead_subscriber("order.paid", "erp")
    def erp_gave_up(job, session):
        runs["erp_dead"].append((job.live_id, job.subscription_id, job.payload))
        session.execute(effects.insert().values(job_id=job.id, note="compensated"))
        return "ticket opened"

    publication_id = app.publish(None, "order.paid", {"order": 42}, tenant=7)
    backend.drain(app)

    jobs = {j["id"]: j for j in backend.jobs()}
    record = jobs[publication_id]
    assert (record["task"], record["status"], record["attempt"]) == ("order.paid", "succeeded", 0)
    assert record["subscription_id"] == "*" and record["publication_id"] is None
    assert record["message"] == "published to 2 subscription(s): erp, index"
    assert record["finished_at"] is not None

    live = backend.deliveries(publication_id)
    assert set(live) == {"index", "erp"}
    index, erp = live["index"], live["erp"]
    assert (index["status"], index["attempt"], index["result"]) == (
        "succeeded",
        1,
        "indexed order 42",
    )
    assert runs["index"] == [1]  # ran once, although its sibling failed three times
    assert (erp["status"], erp["attempt"], erp["max_attempts"]) == ("dead", 3, 3)
    assert erp["message"].startswith("ConnectionError: ERP down (attempt 3)")
    assert runs["erp"] == [1, 2, 3]
    for delivery in (index, erp):
        assert delivery["task"] == "order.paid" and delivery["payload"] == {"order": 42}
        assert delivery["tenant"] == 7 and delivery["publication_id"] == publication_id

    (dead,) = [j for j in jobs.values() if j["dead"]]
    assert (dead["live_id"], dead["subscription_id"], dead["publication_id"]) == (
        erp["id"],
        "erp",
        publication_id,
    )
    assert (dead["status"], dead["result"]) == ("succeeded", "ticket opened")
    assert runs["erp_dead"] == [(erp["id"], "erp", {"order": 42})]
    # Only the successful handlers' writes remain; erp's three attempts rolled back theirs.
    assert backend.effect_ids() == sorted([index["id"], dead["id"]])


def test_tenant_and_business_group_filters_route_publications(backend):
    app = backend.app()
    app.add_subscription(None, "everyone", "invoice.issued")
    app.add_subscription(None, "tenant7", "invoice.issued", tenant=7)
    app.add_subscription(None, "tenant8", "invoice.issued", tenant=8)
    app.add_subscription(None, "group_a", "invoice.issued", business_group="A")
    app.add_subscription(None, "tenant7_group_b", "invoice.issued", tenant=7, business_group="B")
    app.add_subscription(None, "other_topic", "invoice.cancelled")
    # A row written by hand with empty strings / no tenant behaves like "no filter".
    subscriptions = app.tables.subscriptions
    with app.engine.begin() as conn:
        conn.execute(
            subscriptions.insert().values(id="by_sql", topic="invoice.issued", business_group="")
        )

    cases = {
        (7, "A"): ["by_sql", "everyone", "group_a", "tenant7"],
        (7, "B"): ["by_sql", "everyone", "tenant7", "tenant7_group_b"],
        (8, None): ["by_sql", "everyone", "tenant8"],
        (None, "A"): ["by_sql", "everyone", "group_a"],
        (None, None): ["by_sql", "everyone"],
        (9, "C"): ["by_sql", "everyone"],
    }
    for (tenant, group), expected in cases.items():
        publication_id = app.publish(
            None, "invoice.issued", {"t": tenant, "g": group}, tenant=tenant, business_group=group
        )
        reached = backend.deliveries(publication_id)
        assert sorted(reached) == expected, (tenant, group)
        assert all(j["tenant"] == tenant for j in reached.values())
        assert all(j["business_group"] == group for j in reached.values())
        assert app.get_job(publication_id)["message"].endswith(", ".join(expected))


def test_inactive_subscriptions_get_nothing(backend):
    app = backend.app()
    app.add_subscription(None, "on", "stock.low")
    app.add_subscription(None, "off", "stock.low")
    app.add_subscription(None, "born_off", "stock.low", active=False)
    disabled = app.disable_subscription(None, "off")
    assert disabled.active is False
    seen = []

    for name in ("on", "off", "born_off"):
        app.subscriber("stock.low", name)(lambda job, session: seen.append(job.subscription_id))

    publication_id = app.publish(None, "stock.low", {"sku": "X"})
    assert sorted(backend.deliveries(publication_id)) == ["on"]
    backend.run_worker(app)
    assert seen == ["on"]

    app.enable_subscription(None, "off")
    publication_id = app.publish(None, "stock.low", {"sku": "Y"})
    assert sorted(backend.deliveries(publication_id)) == ["off", "on"]
    assert [s.id for s in app.subscriptions("stock.low", active=False)] == ["born_off"]


def test_a_publication_nobody_subscribes_to_is_recorded_finished(backend):
    app = backend.app()
    app.add_subscription(None, "elsewhere", "other.topic")
    app.add_subscription(None, "off", "lonely.topic", active=False)
    app.add_subscription(None, "tenant3", "lonely.topic", tenant=3)

    publication_id = app.publish(None, "lonely.topic", {"n": 1}, tenant=4, business_group="G")
    (record,) = backend.jobs()
    assert record["id"] == publication_id
    assert (record["status"], record["attempt"], record["subscription_id"]) == (
        "succeeded",
        0,
        "*",
    )
    assert record["message"] == (
        "no active subscription matches topic 'lonely.topic' (tenant 4, business group 'G'): "
        "nothing to deliver"
    )
    assert record["finished_at"] is not None
    assert backend.run_worker(app).processed == 0  # nothing is left pending


def test_publish_commits_or_rolls_back_with_the_callers_transaction(backend):
    app = backend.app()
    app.add_subscription(None, "s1", "order.created")
    app.add_subscription(None, "s2", "order.created")

    with Session(app.engine) as session:
        session.begin()
        session.execute(effects.insert().values(job_id=1, note="the order"))
        app.publish(session, "order.created", {"order": 1})
        session.rollback()
    assert backend.jobs() == [] and backend.effect_ids() == []

    with Session(app.engine) as session, session.begin():
        session.execute(effects.insert().values(job_id=2, note="the order"))
        publication_id = app.publish(session, "order.created", {"order": 2})
    assert sorted(backend.deliveries(publication_id)) == ["s1", "s2"]
    assert len(backend.jobs()) == 3 and backend.effect_ids() == [2]

    with app.engine.connect() as conn:
        conn.begin()
        app.publish(conn, "order.created", {"order": 3})
        conn.rollback()
    assert len(backend.jobs()) == 3


def test_subscriber_options_and_explicit_publish_options(backend):
    app = backend.app()
    app.add_subscription(None, "slow_lane", "report.requested")
    app.add_subscription(None, "plain", "report.requested")

    @app.subscriber("report.requested", "slow_lane", queue="reports", priority=5, max_attempts=2)
    def slow_lane(job, session):
        return f"{job.queue}:{job.priority}"

    @app.subscriber("report.requested", "plain")
    def plain(job, session):
        return f"{job.queue}:{job.priority}"

    publication_id = app.publish(None, "report.requested", {}, external_key="r-1", origin="web")
    reached = backend.deliveries(publication_id)
    assert (reached["slow_lane"]["queue"], reached["slow_lane"]["priority"]) == ("reports", 5)
    assert reached["slow_lane"]["max_attempts"] == 2
    assert (reached["plain"]["queue"], reached["plain"]["priority"]) == ("default", 50)
    assert reached["plain"]["max_attempts"] == 20  # the App's default
    assert {j["external_key"] for j in reached.values()} == {"r-1"}
    assert {j["origin"] for j in reached.values()} == {"web"}

    # Registered queues are consumed by default; explicit options beat registered ones.
    backend.run_worker(app)
    finished = backend.deliveries(publication_id)
    assert finished["slow_lane"]["result"] == "reports:5"
    assert finished["plain"]["result"] == "default:50"

    explicit = app.publish(None, "report.requested", {}, queue="urgent", priority=1)
    assert {(j["queue"], j["priority"]) for j in backend.deliveries(explicit).values()} == {
        ("urgent", 1)
    }

    delayed = app.publish(None, "report.requested", {}, delay=3600)
    reached = backend.deliveries(delayed)
    assert all((j["run_at"] - j["created_at"]).total_seconds() > 3500 for j in reached.values())
    assert backend.run_worker(app, queues=["reports", "default"]).processed == 0


def test_a_delivery_nobody_handles_fails_with_a_clear_message(backend):
    app = backend.app(retry_base_interval=60)
    app.add_subscription(None, "forgotten", "user.deleted")

    publication_id = app.publish(None, "user.deleted", {"user": 5})
    backend.run_worker(app)
    job = backend.deliveries(publication_id)["forgotten"]
    assert (job["status"], job["attempt"]) == ("available", 1)  # retried later, not dropped
    assert "no subscriber is registered for subscription 'forgotten'" in job["message"]
    assert "@app.subscriber('user.deleted', 'forgotten')" in job["message"]
    assert "Traceback" not in job["message"]


def test_bad_publish_input_is_refused_before_anything_is_written(backend):
    app = backend.app()
    app.add_subscription(None, "s", "t")
    with pytest.raises(dbqueue.PayloadError):
        app.publish(None, "t", {"when": object()})
    with pytest.raises(dbqueue.ConfigurationError, match="priority"):
        app.publish(None, "t", {}, priority="high")
    with pytest.raises(dbqueue.UnsafeIdentifierError, match="task name"):
        app.publish(None, "", {})
    with pytest.raises(dbqueue.ConfigurationError, match="already exists"):
        app.add_subscription(None, "s", "t")
    with pytest.raises(dbqueue.ConfigurationError, match="no subscription 'missing'"):
        app.disable_subscription(None, "missing")
    with pytest.raises(dbqueue.ConfigurationError, match="http method 'PATCH'"):
        app.add_subscription(None, "p", "t", url="https://example.com/", method="PATCH")
    with pytest.raises(dbqueue.UnsafeIdentifierError, match="subscription id"):
        app.subscriber("t", "no spaces please")
    assert backend.jobs() == []


def test_seed_pub_sub_worker_and_queue_client(backend):
    app = backend.app(retry_base_interval=0.01, max_attempts=2)
    app.add_subscription(None, "teste", "processo_teste", tenant=1)
    app.add_subscription(None, "quebrado", "processo_teste")
    calls = []

    class MyWorker(WorkerPubSubBase):
        @Subscriber("teste")
        def execute_subscriber_teste(self, payload, subscription, tarefa, bd_conn):
            calls.append(("teste", payload, subscription["processo"], tarefa["subscriber_id"]))
            bd_conn.execute(effects.insert().values(job_id=tarefa["id"], note="seed"))
            return "ok"

        @Subscriber("quebrado")
        def execute_subscriber_quebrado(self, payload, subscription, tarefa, bd_conn):
            raise RuntimeError("sempre falha")

        @DeadSubscriber("quebrado")
        def execute_dead_subscriber_quebrado(self, payload, subscription, tarefa, bd_conn):
            calls.append(("morto", payload, subscription.id, tarefa["live_id"] is not None))
            return "tratado"

    worker = MyWorker(app)
    with app.engine.connect() as conn, conn.begin():
        client = QueueClient(conn, app=app)
        publication_id = client.insert_task_pub_sub(
            "origem", "destino", "processo_teste", "chave-1", {"msg": "olá"}, tenant=1
        )
    backend.drain(worker.app)

    reached = backend.deliveries(publication_id)
    assert reached["teste"]["status"] == "succeeded" and reached["teste"]["message"] == "ok"
    assert reached["quebrado"]["status"] == "dead"
    assert reached["teste"]["origin"] == "origem" and reached["teste"]["external_key"] == "chave-1"
    assert sorted(calls) == [
        ("morto", {"msg": "olá"}, "quebrado", True),
        ("teste", {"msg": "olá"}, "processo_teste", "teste"),
    ]
    assert backend.effect_ids() == [reached["teste"]["id"]]


def test_plain_sql_subscriptions_are_honoured(backend):
    app = backend.app()
    subscriptions = app.tables.subscriptions
    with app.engine.begin() as conn:
        conn.execute(
            sa.insert(subscriptions).values(id="sql_made", topic="by.sql", tenant=None, url=None)
        )
    (made,) = app.subscriptions("by.sql")
    assert (made.active, made.method, made.created_at is not None) == (True, "POST", True)

    @app.subscriber("by.sql", "sql_made")
    def handler(job, session):
        return "via sql"

    publication_id = app.publish(None, "by.sql", {})
    backend.run_worker(app)
    assert backend.deliveries(publication_id)["sql_made"]["result"] == "via sql"

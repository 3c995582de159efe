"""Managing subscriptions from Python (update, remove), and the worker's start-up warnings about
subscriptions nothing can serve, on every database."""

from __future__ import annotations

import logging

import pytest

from dbqueue import ConfigurationError


def test_update_and_remove(database):
    app = database.app()
    app.add_subscription(None, "s1", "t1", url="https://a.example/hook", headers={"X-A": "1"})

    sub = app.update_subscription(None, "s1", topic="t2", tenant=5, method="get")
    assert (sub.topic, sub.tenant, sub.http_method) == ("t2", 5, "GET")
    assert sub.url == "https://a.example/hook" and sub.headers == {"X-A": "1"}
    publication_id = app.publish(None, "t2", {"n": 1}, tenant=5)
    assert list(database.deliveries(publication_id)) == ["s1"]

    with pytest.raises(ConfigurationError, match="headers but no url"):
        app.update_subscription(None, "s1", url=None)
    with pytest.raises(ConfigurationError, match="http method 'PATCH'"):
        app.update_subscription(None, "s1", method="PATCH")
    with pytest.raises(TypeError, match="'colour'"):
        app.update_subscription(None, "s1", colour="red")
    with pytest.raises(ConfigurationError, match="no subscription 'nope'.*subscriptions list"):
        app.update_subscription(None, "nope", tenant=1)
    assert app.get_subscription("s1") == sub  # refused changes change nothing

    cleared = app.update_subscription(None, "s1", url=None, headers=None, tenant=None)
    assert (cleared.url, cleared.headers, cleared.tenant) == (None, None, None)

    # In the caller's transaction: a rollback undoes it.
    with app.engine.connect() as conn, conn.begin() as transaction:
        assert app.remove_subscription(conn, "s1").topic == "t2"
        transaction.rollback()
    assert app.get_subscription("s1") is not None
    assert app.remove_subscription(None, "s1").id == "s1"
    assert app.get_subscription("s1") is None
    with pytest.raises(ConfigurationError, match="no subscription 's1'"):
        app.remove_subscription(None, "s1")


def test_a_worker_warns_about_subscriptions_nothing_serves(database, caplog):
    app = database.app()

    def handler(job, session):
        return None

    app.subscriber("order.paid", "search")(handler)  # code, but no subscription row
    app.subscriber("order.paid", "mailer")(handler)  # the row receives another topic
    app.add_subscription(None, "mailer", "order.sent")
    app.add_subscription(None, "orphan", "order.paid")  # active, no url, no code
    app.add_subscription(None, "paused", "order.paid", active=False)  # disabled on purpose
    app.add_subscription(None, "hook", "order.paid", url="https://a.example/hook")
    app.subscriber("*", "any")(handler)
    app.add_subscription(None, "any", "order.paid")
    app.subscriber("order.paid", "fine")(handler)
    app.add_subscription(None, "fine", "order.paid")

    with caplog.at_level(logging.WARNING, logger="dbqueue.worker"):
        database.run_worker(app, maintenance=False)
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "dbqueue.worker" and r.levelno == logging.WARNING
    ]
    assert len(warnings) == 3, warnings
    missing, moved, orphan = sorted(warnings, key=lambda w: ("search" not in w, "mailer" not in w))
    assert "subscriber 'search' (topic 'order.paid') is registered" in missing
    assert "dbqueue subscriptions add search --topic order.paid" in missing
    assert "subscriber 'mailer' is registered for topic 'order.paid'" in moved
    assert "receives topic 'order.sent'" in moved
    assert "active subscription 'orphan' (topic 'order.paid') has no webhook url" in orphan
    assert "@app.subscriber('order.paid', 'orphan')" in orphan

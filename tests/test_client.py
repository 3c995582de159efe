"""The bulk enqueue's fast path (``client.plain_rows``) builds exactly the rows the general
path (a NewJob per item, then ``flat_values``) builds, and leaves every item that sets an
option, or names its task oddly, to the general path."""

from __future__ import annotations

import pytest

import dbqueue
from dbqueue.base.payload import EncodedPayload
from dbqueue.engine.records import flat_values, new_jobs
from dbqueue.errors import PayloadError, UnsafeIdentifierError
from dbqueue.runtime.enqueue import job_for_task, plain_rows

PAYLOADS = [None, {}, {"n": 1}, {"b": [1, 2.5, "é"], "a": None}, "text", 0, [{"z": 1, "a": 2}]]


@pytest.fixture
def app(tmp_path):
    app = dbqueue.App(f"sqlite:///{tmp_path}/q.db", max_attempts=9)

    @app.task("registered", queue="billing", priority=3, max_attempts=2)
    def registered(job, session):
        return None

    return app


def test_plain_rows_are_the_general_paths_rows(app):
    items = [{"task": task, "payload": p} for p in PAYLOADS for task in ("registered", "loose")]
    items.append({"task": "loose"})  # no payload: null
    general = [job_for_task(app.context, i["task"], i.get("payload"), {}) for i in items]
    rows = plain_rows(app.context, items)
    assert rows == flat_values(general)
    # as EncodedPayload: the payload column's bind processor would encode a plain str again
    assert {type(text) for text in rows[2::6]} == {EncodedPayload}
    assert new_jobs(flat_values(general)) == general


@pytest.mark.parametrize(
    "item", [{"task": "loose", "priority": 1}, {"payload": 1}, {"task": ["loose"]}]
)
def test_an_item_with_an_option_or_an_odd_task_takes_the_general_path(app, item):
    assert plain_rows(app.context, [{"task": "loose"}, item]) is None


def test_bad_plain_items_are_refused_as_by_the_general_path(app):
    with pytest.raises(UnsafeIdentifierError, match="task name"):
        plain_rows(app.context, [{"task": "x" * 1000}])
    with pytest.raises(PayloadError, match="not JSON-serialisable"):
        plain_rows(app.context, [{"task": "loose", "payload": {1, 2}}])

"""What the dashboard's POSTs do, each one call of the App; each returns the line shown after.

One job: ``ids`` (comma-separated). In bulk by filter: the dead page's queue/task for requeue
and delete (``app.requeue_dead`` / ``app.delete_dead`` with ``ids=None``), the jobs page's
filter for cancel (at most BULK_CANCEL jobs per POST: a cancel of a running job is a request
that its worker carries out).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dbqueue.app.facade import App
from dbqueue.dashboard import queries

BULK_CANCEL = 10_000


class ActionError(Exception):
    """An action the form does not describe well enough: shown, nothing done."""


def _ids(form: dict[str, str]) -> list[int]:
    parts = [p.strip() for p in form.get("ids", "").replace(" ", ",").split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise ActionError("no job ids given")
    return [int(p) for p in parts]


def _dead_filter(form: dict[str, str]) -> dict[str, Any]:
    return {"queue": form.get("queue") or None, "task": form.get("task") or None}


def _listed(verb: str, ids: list[int]) -> str:
    shown = " ".join(map(str, ids[:20])) + (" …" if len(ids) > 20 else "")
    return f"{verb} {len(ids)}" + (f": {shown}" if ids else "")


def requeue(app: App, form: dict[str, str]) -> str:
    return _listed("requeued", app.requeue_dead(_ids(form)))


def delete(app: App, form: dict[str, str]) -> str:
    return _listed("deleted", app.delete_dead(_ids(form)))


def requeue_matching(app: App, form: dict[str, str]) -> str:
    return _listed("requeued", app.requeue_dead(None, **_dead_filter(form)))


def delete_matching(app: App, form: dict[str, str]) -> str:
    return _listed("deleted", app.delete_dead(None, **_dead_filter(form)))


def cancel(app: App, form: dict[str, str]) -> str:
    report = app.cancel(_ids(form))
    return "; ".join(f"{job_id}: {outcome}" for job_id, outcome in report.items())


def cancel_matching(app: App, form: dict[str, str]) -> str:
    where = queries.JobFilter.from_params(form)
    if where.status not in ("available", "scheduled", "running"):
        raise ActionError("bulk cancel needs a status filter of available, scheduled or running")
    with app.engine.connect() as conn:
        ids = queries.matching_ids(app, conn, where, BULK_CANCEL)
    report = app.cancel(ids) if ids else {}
    outcomes: dict[str, int] = {}
    for outcome in report.values():
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return "cancel: " + (", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())) or "no job")


def subscription(app: App, form: dict[str, str]) -> str:
    name = form.get("subscription", "")
    if not name:
        raise ActionError("no subscription given")
    if form.get("active") == "1":
        app.enable_subscription(None, name)
        return f"subscription {name} enabled"
    app.disable_subscription(None, name)
    return f"subscription {name} disabled"


ACTIONS: dict[str, Callable[[App, dict[str, str]], str]] = {
    "requeue": requeue,
    "delete": delete,
    "requeue-matching": requeue_matching,
    "delete-matching": delete_matching,
    "cancel": cancel,
    "cancel-matching": cancel_matching,
    "subscription": subscription,
}

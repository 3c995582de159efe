"""``dbqueue subscriptions``: who receives each topic, by code or by webhook: list, add, update,
enable, disable, remove (credentials shown as ***)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from dbqueue.app.facade import App
from dbqueue.cli.options import database_options
from dbqueue.cli.output import json_default, json_option
from dbqueue.errors import ConfigurationError
from dbqueue.pubsub.subscriptions import (
    Subscription,
    parse_header,
    redact_headers,
    redact_url,
)


@click.group()
def subscriptions() -> None:
    """Pub/sub subscriptions: who receives each topic (code, or a webhook)."""


@subscriptions.command("list")
@database_options
@click.option("--topic", help="Only this topic's subscriptions.")
@json_option
def subscriptions_list(app: App, topic: str | None, as_json: bool) -> None:
    """List subscriptions by topic (credentials in urls and headers are shown as ***)."""
    rows = app.subscriptions(topic)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in rows], indent=2, default=json_default))
        return
    if not rows:
        click.echo("no subscriptions")
        return
    for sub in rows:
        click.echo(_describe_subscription(sub))


def _describe_subscription(sub: Subscription) -> str:
    target = f"{sub.method} {redact_url(sub.url)}" if sub.is_webhook else "code"
    filters = []
    if sub.tenant is not None:
        filters.append(f"tenant={sub.tenant}")
    if sub.business_group:
        filters.append(f"business_group={sub.business_group}")
    headers = redact_headers(sub.headers)
    if isinstance(headers, dict) and headers:
        filters.append("headers: " + ", ".join(f"{k}: {v}" for k, v in headers.items()))
    state = "active" if sub.active else "disabled"
    extra = f"  {'  '.join(filters)}" if filters else ""
    return f"{sub.id:24} {sub.topic:24} {state:8} {target}{extra}"


def one_subscription(name: str) -> Callable[[Callable[..., Any]], Any]:
    """``dbqueue subscriptions NAME SUBSCRIPTION_ID [options]``: a command on one subscription."""

    def register(command: Callable[..., Any]) -> Any:
        with_id = click.argument("subscription_id")(command)
        return subscriptions.command(name)(database_options(with_id))

    return register


#: ``subscriptions update`` option → the change it makes (``update_subscription``'s names).
CHANGE_NAMES = {"webhook_url": "url"}


#: ``--clear`` choices → the change that empties them.
CLEARABLE = {
    "tenant": "tenant",
    "business-group": "business_group",
    "webhook-url": "url",
    "headers": "headers",
}


@subscriptions.command("add")
@database_options
@click.argument("subscription_id")
@click.option("--topic", required=True, help="The topic (task name) to receive.")
@click.option("--tenant", type=int, help="Only publications for this tenant.")
@click.option("--business-group", help="Only publications for this business group.")
@click.option(
    "--webhook-url",
    "webhook_url",
    help="Deliveries become HTTP calls to this URL, no code needed (--url is the database's).",
)
@click.option("--method", default="POST", show_default=True, help="GET, POST or PUT.")
@click.option("--header", "headers", multiple=True, help="'Name: value' (repeatable).")
@click.option("--disabled", is_flag=True, help="Add it inactive.")
def subscriptions_add(
    app: App,
    subscription_id: str,
    topic: str,
    tenant: int | None,
    business_group: str | None,
    webhook_url: str | None,
    method: str,
    headers: tuple[str, ...],
    disabled: bool,
) -> None:
    """Subscribe SUBSCRIPTION_ID to a topic."""
    parsed = _parse_headers(headers)
    sub = app.add_subscription(
        None,
        subscription_id,
        topic,
        tenant=tenant,
        business_group=business_group,
        url=webhook_url,
        method=method,
        headers=parsed or None,
        active=not disabled,
    )
    click.echo(f"added {_describe_subscription(sub)}")


@one_subscription("disable")
def subscriptions_disable(app: App, subscription_id: str) -> None:
    """Stop a subscription receiving publications (pending webhook deliveries wait)."""
    sub = app.disable_subscription(None, subscription_id)
    click.echo(f"disabled subscription {sub.id} (topic {sub.topic})")


@one_subscription("enable")
def subscriptions_enable(app: App, subscription_id: str) -> None:
    """Let a disabled subscription receive publications again."""
    sub = app.enable_subscription(None, subscription_id)
    click.echo(f"enabled subscription {sub.id} (topic {sub.topic})")


def _parse_headers(headers: tuple[str, ...]) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for text in headers:
        name, value = parse_header(text)
        if name.lower() in (n.lower() for n in parsed):
            raise ConfigurationError(f"--header {name} is given twice: give each header once")
        parsed[name] = value
    return parsed


@one_subscription("update")
@click.option("--topic", help="Receive this topic instead.")
@click.option("--tenant", type=int, help="Only publications for this tenant.")
@click.option("--business-group", help="Only publications for this business group.")
@click.option("--webhook-url", "webhook_url", help="Deliver by HTTP to this URL.")
@click.option("--method", help="GET, POST or PUT.")
@click.option(
    "--header", "headers", multiple=True, help="'Name: value' (repeatable; replaces all)."
)
@click.option(
    "--clear",
    "cleared",
    multiple=True,
    type=click.Choice(sorted(CLEARABLE)),
    help="Empty this field (repeatable).",
)
def subscriptions_update(
    app: App, subscription_id: str, headers: tuple[str, ...], cleared: tuple[str, ...], **given: Any
) -> None:
    """Change a subscription; the options not given keep their values."""
    changes = {CHANGE_NAMES.get(k, k): v for k, v in given.items() if v is not None}
    if headers:
        changes["headers"] = _parse_headers(headers)
    for option in cleared:
        name = CLEARABLE[option]
        if name in changes:
            raise ConfigurationError(f"--clear {option} and a new value for it: give one of them")
        changes[name] = None
    if not changes:
        raise ConfigurationError(
            "nothing to change: give --topic, --tenant, --business-group, --webhook-url, "
            "--method, --header or --clear"
        )
    sub = app.update_subscription(None, subscription_id, **changes)
    click.echo(f"updated {_describe_subscription(sub)}")


@one_subscription("remove")
def subscriptions_remove(app: App, subscription_id: str) -> None:
    """Delete a subscription (its pending webhook deliveries fail their attempts)."""
    sub = app.remove_subscription(None, subscription_id)
    click.echo(f"removed subscription {sub.id} (topic {sub.topic})")

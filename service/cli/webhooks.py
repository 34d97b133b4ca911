"""`trainctl webhooks add|list|remove|deliveries`: URLs told of run state changes (admin only;
docs/design/webhooks.md, "Webhooks")."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer
from rich.table import Table

from trainctl.service.cli.common import client, console, err_console, print_json
from trainctl.service.schemas import (
    TERMINAL_EVENTS,
    DeliveryAttemptPublic,
    DeliveryPublic,
    WebhookPublic,
)
from trainctl.store.vocabulary import WEBHOOK_EVENTS, WebhookEvent

app = typer.Typer(no_args_is_help=True, help="Webhooks: POSTs to a URL when runs change state.")
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
WebhookId = Annotated[int, typer.Argument(help="The webhook's id (`trainctl webhooks list`).")]


def parse_events(values: list[str] | None) -> list[WebhookEvent] | None:
    """`--events succeeded,failed` or `--events succeeded --events failed`; None: the default."""
    if not values:
        return None
    events = [e.strip() for value in values for e in value.split(",") if e.strip()]
    unknown = [e for e in events if e not in WEBHOOK_EVENTS]
    if unknown or not events:
        raise typer.BadParameter(
            f"unknown event {', '.join(map(repr, unknown))}; choose from "
            f"{', '.join(WEBHOOK_EVENTS)}",
            param_hint="--events",
        )
    return [event for event in WEBHOOK_EVENTS if event in events]


def when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else ""


def webhooks_table(items: list[WebhookPublic]) -> Table:
    t = Table("ID", "URL", "EVENTS", "CREATED", "BY", box=None)
    for w in items:
        t.add_row(str(w.id), w.url, ",".join(w.events), when(w.created_at), w.created_by or "")
    return t


def deliveries_table(items: list[DeliveryPublic]) -> Table:
    """The delivery log: a row per attempt, and one for a delivery not tried yet."""
    t = Table("TIME", "DELIVERY", "RUN", "EVENT", "ATTEMPT", "RESULT", "MS", "STATE", box=None)
    for d in items:
        attempts: list[DeliveryAttemptPublic | None] = [*d.attempts] or [None]
        for a in attempts:
            result = "" if a is None else a.error or f"HTTP {a.status_code}"
            t.add_row(when(a.started_at if a else d.created_at), d.id, d.run_id, d.event,
                      str(a.attempt) if a else "-", result,
                      f"{a.duration_ms:.0f}" if a else "", d.state)  # fmt: skip
    return t


@app.command("add")
def add_webhook(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(help="Where to POST: http:// or https://.")],
    events: Annotated[
        list[str] | None,
        typer.Option(
            help=f"Run states to notify, and 'health' for a train run's loss-health "
            f"interventions, comma-separated: {', '.join(WEBHOOK_EVENTS)} "
            f"(default: {','.join(TERMINAL_EVENTS)}).",
            show_default=False,
        ),
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Register a URL and print its signing secret: it is shown this once."""
    chosen = parse_events(events)
    with client(ctx) as api:
        created = api.create_webhook(url, chosen)
    if as_json:
        print_json(created)
        return
    # The secret alone on stdout, so that `trainctl webhooks add URL > hook.secret` keeps it.
    err_console.print(
        f"added webhook {created.id} for {created.url} on {', '.join(created.events)}; "
        "its signing secret is not shown again:"
    )
    console.print(created.secret, soft_wrap=True)


@app.command("list")
def list_webhooks(ctx: typer.Context, as_json: AsJson = False) -> None:
    """List webhooks: id, URL, events, when and by whom registered (never their secrets)."""
    with client(ctx) as api:
        items = api.list_webhooks()
    if as_json:
        print_json(items)
    elif items:
        console.print(webhooks_table(items))
    else:
        err_console.print("no webhooks; add one with `trainctl webhooks add URL`")


@app.command("remove")
def remove_webhook(ctx: typer.Context, webhook_id: WebhookId) -> None:
    """Remove a webhook and its delivery log: nothing more is sent to it."""
    with client(ctx) as api:
        removed = api.delete_webhook(webhook_id)
    err_console.print(f"removed webhook {removed.id} ({removed.url})")


@app.command("deliveries")
def list_deliveries(
    ctx: typer.Context,
    webhook_id: WebhookId,
    limit: Annotated[int, typer.Option(min=1, max=500, help="The newest this many.")] = 50,
    as_json: AsJson = False,
) -> None:
    """Show a webhook's delivery log: each attempt's time, status code or error, duration."""
    with client(ctx) as api:
        items = api.webhook_deliveries(webhook_id, limit)
    if as_json:
        print_json(items)
    elif items:
        console.print(deliveries_table(items))
    else:
        err_console.print(f"webhook {webhook_id} has no deliveries yet")

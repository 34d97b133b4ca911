"""Webhooks: register, list, remove, and read the delivery log (admin only, reads too:
docs/design/webhooks.md, "Webhooks")."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, status

from trainctl.service.deps import Admin, SettingsDep, requires
from trainctl.service.errors import error_responses
from trainctl.service.routing import JSON_NUMBER_TEXT, ApiRoute
from trainctl.service.schemas import (
    DeliveriesPublic,
    DeliveryPublic,
    WebhookCreate,
    WebhookCreated,
    WebhookPublic,
    WebhooksPublic,
)
from trainctl.service.webhooks.dispatcher import Dispatcher
from trainctl.service.webhooks.targets import url_host
from trainctl.store.db.webhooks import WebhookStore
from trainctl.store.exceptions import InvalidRequest

router = APIRouter(
    route_class=ApiRoute,
    prefix="/webhooks",
    tags=["webhooks"],
    dependencies=[requires("admin")],
    responses=error_responses(403, 422, 503),
)


async def get_webhooks(request: Request) -> WebhookStore:
    store: WebhookStore = request.app.state.webhooks
    return store


async def get_dispatcher(request: Request) -> Dispatcher | None:
    dispatcher: Dispatcher | None = request.app.state.webhook_dispatcher
    return dispatcher


WebhooksDep = Annotated[WebhookStore, Depends(get_webhooks)]
DispatcherDep = Annotated[Dispatcher | None, Depends(get_dispatcher)]
WebhookId = Annotated[
    int,
    Path(ge=1, le=2**63 - 1, description="The webhook's id, as registering it answered."),
    JSON_NUMBER_TEXT,
]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=WebhookCreated,
    responses=error_responses(400, 413),  # a body unreadable or too large
)
def create_webhook(
    body: WebhookCreate,
    settings: SettingsDep,
    webhooks: WebhooksDep,
    dispatcher: DispatcherDep,
    admin: Admin,
) -> WebhookCreated:
    """Register a URL for run state changes; the answer holds its signing secret, shown once."""
    refused = settings.webhook_policy.check_host(url_host(body.url))
    if refused is not None:
        raise InvalidRequest(refused)
    webhook = webhooks.create(body.url, body.events, admin.name if admin else None)
    if dispatcher is not None:
        dispatcher.wake()
    return WebhookCreated.model_validate(webhook)


@router.get("", response_model=WebhooksPublic)
def list_webhooks(webhooks: WebhooksDep) -> WebhooksPublic:
    """List the webhooks (never their secrets)."""
    return WebhooksPublic(items=[WebhookPublic.model_validate(w) for w in webhooks.list_webhooks()])


@router.delete("/{webhook_id}", response_model=WebhookPublic, responses=error_responses(404))
def delete_webhook(webhook_id: WebhookId, webhooks: WebhooksDep) -> WebhookPublic:
    """Remove a webhook and its delivery log; nothing more is sent to it."""
    return WebhookPublic.model_validate(webhooks.delete(webhook_id))


@router.get(
    "/{webhook_id}/deliveries", response_model=DeliveriesPublic, responses=error_responses(404)
)
def list_deliveries(
    webhook_id: WebhookId,
    webhooks: WebhooksDep,
    limit: Annotated[int, Query(ge=1, le=500), JSON_NUMBER_TEXT] = 50,
) -> DeliveriesPublic:
    """Read a webhook's delivery log: its newest deliveries, each with every attempt."""
    items = webhooks.deliveries(webhook_id, limit)
    return DeliveriesPublic(items=[DeliveryPublic.model_validate(d) for d in items])

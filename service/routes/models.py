"""The models a request may name (docs/models.md)."""

from __future__ import annotations

from fastapi import APIRouter

from trainctl.service.deps import RunsDep, SettingsDep
from trainctl.service.devices import live_workers
from trainctl.service.presenters import public_models
from trainctl.service.routing import ApiRoute
from trainctl.service.schemas import ModelsPublic

router = APIRouter(route_class=ApiRoute, tags=["models"])


@router.get("/models", response_model=ModelsPublic)
def list_models(settings: SettingsDep, runs: RunsDep) -> ModelsPublic:
    """List the models a request may name: presets, live workers' plug-ins, transformers types."""
    return public_models(live_workers(runs, settings.lease_seconds))

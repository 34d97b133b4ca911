"""The models a request may name (docs/models.md)."""

from __future__ import annotations

from fastapi import APIRouter

from trainctl.service.deps import SettingsDep, WorkersDep
from trainctl.service.devices import live_workers
from trainctl.service.presenters import public_models
from trainctl.service.routing import ApiRoute
from trainctl.service.schemas import ModelsPublic

router = APIRouter(route_class=ApiRoute, tags=["models"])


@router.get("/models", response_model=ModelsPublic)
def list_models(settings: SettingsDep, workers: WorkersDep) -> ModelsPublic:
    """List the models a request may name: presets, live workers' plug-ins, transformers types."""
    return public_models(live_workers(workers, settings.lease_seconds))

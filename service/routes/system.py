"""The service itself: its workers, liveness and readiness."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from trainctl.service.deps import SettingsDep, WorkersDep, requires
from trainctl.service.devices import live_workers
from trainctl.service.errors import error_responses
from trainctl.service.presenters import public_worker
from trainctl.service.routing import ApiRoute
from trainctl.service.schemas import HealthPublic, ReadinessPublic, WorkerPublic, WorkersPublic

# Liveness stays open (no token) so that probes and load balancers need no secret; it says
# nothing about the runs.
public_router = APIRouter(route_class=ApiRoute, tags=["system"])
router = APIRouter(route_class=ApiRoute, tags=["system"], responses=error_responses(503))
WorkerId = Annotated[str, Path(description="The worker's id (GET /workers)", max_length=100)]


# `async def`: it needs no thread, so it answers even while every thread of the pool is busy.
@public_router.get("/healthz", response_model=HealthPublic)
async def read_health() -> dict[str, Any]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz", response_model=ReadinessPublic)
def read_readiness(settings: SettingsDep, workers: WorkersDep) -> dict[str, Any]:
    """Readiness: the run database answers; how many workers are alive."""
    alive = live_workers(workers, settings.lease_seconds)
    return {"status": "ready", "database": "ok", "workers_alive": len(alive)}


@router.get("/workers", response_model=WorkersPublic)
def list_workers(settings: SettingsDep, workers: WorkersDep) -> WorkersPublic:
    """List registered workers: their node, GPUs and CPUs, and current run."""
    return WorkersPublic(
        items=[public_worker(w, settings.lease_seconds) for w in workers.list_workers()]
    )


@router.post(
    "/workers/{worker_id}/drain",
    response_model=WorkerPublic,
    dependencies=[requires("admin")],
    responses=error_responses(403, 404),
)
def drain_worker(worker_id: WorkerId, settings: SettingsDep, workers: WorkersDep) -> WorkerPublic:
    """Drain a worker: its run saves and is requeued, within TRAINCTL_DRAIN_SECONDS, then it
    exits and is not restarted."""
    return public_worker(workers.drain(worker_id), settings.lease_seconds)

"""Prometheus metrics of the service, its queue, workers and running runs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from trainctl.service.deps import RunsDep, SettingsDep
from trainctl.service.errors import error_responses
from trainctl.service.metrics import CONTENT_TYPE, ServiceMetrics
from trainctl.service.routing import ApiRoute


async def get_metrics(request: Request) -> ServiceMetrics:
    metrics: ServiceMetrics = request.app.state.metrics
    return metrics


MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]
router = APIRouter(route_class=ApiRoute, tags=["system"], responses=error_responses(503))


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"description": "Prometheus text format.", "content": {CONTENT_TYPE: {}}}},
)
def read_metrics(metrics: MetricsDep, settings: SettingsDep, runs: RunsDep) -> Response:
    """Prometheus metrics: runs by state, queue, workers, step and save times, HTTP."""
    return Response(metrics.render(runs, settings), media_type=CONTENT_TYPE)

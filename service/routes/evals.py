"""The downstream evaluation tasks an evaluate run may name (docs/evals.md;
docs/design/kinds.md, "Run kinds")."""

from __future__ import annotations

from fastapi import APIRouter

from trainctl.service.routing import ApiRoute
from trainctl.service.schemas import EvalTaskPublic, EvalTasksPublic
from trainctl.store.evals.tasks import EVAL_TASKS

router = APIRouter(route_class=ApiRoute, prefix="/evals", tags=["evals"])


@router.get("/tasks", response_model=EvalTasksPublic)
def list_eval_tasks() -> EvalTasksPublic:
    """List the evaluation tasks, with their sizes and metrics."""
    return EvalTasksPublic(items=[EvalTaskPublic.model_validate(t) for t in EVAL_TASKS.values()])

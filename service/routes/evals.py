"""The downstream evaluation tasks an evaluate run may name, and what an evaluate run
predicted for each item (docs/evals.md; docs/design/kinds.md, "Run kinds")."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from trainctl.service.deps import RunId, RunsDep
from trainctl.service.errors import error_responses
from trainctl.service.routing import ApiRoute
from trainctl.service.schemas import EvalItemsPublic, EvalTaskPublic, EvalTasksPublic
from trainctl.store.db.scores import eval_items
from trainctl.store.evals.items import MAX_ITEMS_PAGE
from trainctl.store.evals.tasks import EVAL_TASKS

router = APIRouter(route_class=ApiRoute, tags=["evals"])


@router.get("/evals/tasks", response_model=EvalTasksPublic)
def list_eval_tasks() -> EvalTasksPublic:
    """List the evaluation tasks, with their sizes and metrics."""
    return EvalTasksPublic(items=[EvalTaskPublic.model_validate(t) for t in EVAL_TASKS.values()])


@router.get(
    "/runs/{run_id}/evals/items",
    response_model=EvalItemsPublic,
    responses=error_responses(404, 409),
)
def read_eval_items(
    run_id: RunId,
    runs: RunsDep,
    task: Annotated[
        str | None, Query(description="One of the run's tasks; its first when left out.")
    ] = None,
    offset: Annotated[int, Query(ge=0, le=1 << 31)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_ITEMS_PAGE)] = 100,
) -> EvalItemsPublic:
    """Read an evaluate run's prediction for each item of a task, a page at a time."""
    page = eval_items(runs, run_id, task, offset, limit)
    end = offset + len(page.items)
    return EvalItemsPublic.model_validate(
        {**vars(page), "next_offset": end if end < page.total else None}
    )

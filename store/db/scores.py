"""Reading eval scores back from the run database (docs/evals.md, "Reading the results").

Three readers, one per question: what a run's log holds of each task's newest scores (the
webhooks' payload), which finished evaluations scored a checkpoint (an export's model card),
and what an evaluate run predicted for each item (`GET /runs/{id}/evals/items`). They read
what the evaluate runs wrote (worker/kinds/evaluate.py): metrics events of kind `eval` on the
evaluate run and on the train run that saved the checkpoint, each evaluate run's result, and
its `eval_items` events (store.evals.items).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from trainctl.store.db.runs import RunStore
from trainctl.store.db.schema import read_transaction, run_events, runs
from trainctl.store.evals.items import EVAL_ITEMS_EVENT
from trainctl.store.evals.tasks import EVAL_KIND, EvalResult, TaskScores, split_metric_name
from trainctl.store.exceptions import Conflict, NotFound


def latest_scores(store: RunStore, run_id: str) -> dict[str, TaskScores]:
    """Each task's scores at the latest step the run's log has them for (the newest event of
    that step where it was scored twice), by task name; empty for a run never scored."""
    query = (
        select(run_events.c.data)
        .where(
            run_events.c.run_id == run_id,
            run_events.c.type == "metrics",
            run_events.c.data["kind"].as_string() == EVAL_KIND,
        )
        .order_by(run_events.c.id)
    )
    with read_transaction(store.engine) as conn:
        events = conn.execute(query).scalars().all()
    latest: dict[str, TaskScores] = {}
    for data in events:
        step = data.get("step")
        if not isinstance(step, int):
            continue
        for task, metrics in _by_task(data).items():
            if task not in latest or step >= latest[task].step:
                latest[task] = TaskScores(task, step, metrics)
    return latest


def checkpoint_results(
    store: RunStore, experiment: str, tag: str, step: int | None, source_run: str | None
) -> list[EvalResult]:
    """Every score of the evaluate runs that finished scoring this checkpoint, oldest run
    first. A checkpoint is the train run's step that saved it, whatever tag holds it now
    (`step_200` and `best` at step 200 are the same weights; a `best` saved again since is
    not); one with no run recorded is matched by its tag."""
    query = (
        select(runs.c.id, runs.c.spec, runs.c.result)
        .where(runs.c.kind == "evaluate", runs.c.experiment == experiment)
        .where(runs.c.state == "succeeded")
        .order_by(runs.c.created_at, runs.c.seq)
    )
    with read_transaction(store.engine) as conn:
        rows = conn.execute(query).all()
    found = []
    for row in rows:
        result: dict[str, Any] = row.result or {}
        scored = result.get("checkpoint") or {}
        same_run = source_run is not None and result.get("source_run") == source_run
        same_tag = source_run is None and scored.get("tag") == tag
        if scored.get("step") != step or not (same_run or same_tag):
            continue
        fewshot, limit = result.get("num_fewshot", 0), result.get("limit")
        found += [
            EvalResult(task, metric, float(value), fewshot, limit, row.id)
            for task, scores in (result.get("tasks") or {}).items()
            for metric, value in scores.items()
            if metric != "items" and isinstance(value, int | float)
        ]
    return found


def _by_task(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    """An eval event's scores, by task then metric."""
    tasks: dict[str, dict[str, float]] = {}
    for key, value in data.items():
        named = split_metric_name(key)
        if named is not None and isinstance(value, int | float) and not isinstance(value, bool):
            tasks.setdefault(named[0], {})[named[1]] = float(value)
    return tasks


@dataclass(frozen=True)
class EvalItems:
    """A page of one task's items of an evaluate run."""

    task: str
    total: int
    """Items the run's latest attempt has written for the task (all of them once it ends)."""
    offset: int
    items: list[dict[str, Any]]


def eval_items(
    store: RunStore, run_id: str, task: str | None, offset: int, limit: int
) -> EvalItems:
    """Items `offset` to `offset + limit` of the task (the run's first where none is named),
    from the latest attempt that wrote it. Another kind of run is a `Conflict` and a task the
    run does not score is `NotFound`: the request is well formed, the run holds no such
    items (so an unknown run answers 404 before anything about the task)."""
    run = store.get(run_id)
    tasks = run.spec.get("tasks") if run.kind == "evaluate" else None
    if not isinstance(tasks, list) or not tasks:
        raise Conflict(f"run {run_id} is a {run.kind} run: only evaluate runs score items")
    task = tasks[0] if task is None else task
    if task not in tasks:
        raise NotFound(f"run {run_id} does not score {task!r}; it scores {', '.join(tasks)}")
    chunks = _latest_chunks(store, run_id, task)
    total = sum(count for _, _, count in chunks)
    wanted = [i for i, start, count in chunks if start < offset + limit and offset < start + count]
    query = select(run_events.c.data).where(run_events.c.id.in_(wanted)).order_by(run_events.c.id)
    with read_transaction(store.engine) as conn:
        events = conn.execute(query).scalars().all()
    items = [
        item
        for data in sorted(events, key=lambda d: d["start"])
        for n, item in enumerate(data["items"], start=data["start"])
        if offset <= n < offset + limit
    ]
    return EvalItems(task, total, offset, items)


def _latest_chunks(store: RunStore, run_id: str, task: str) -> list[tuple[int, int, int]]:
    """(event id, start, count) of each chunk the latest attempt wrote for the task, by start;
    the JSON's items stay in the database."""
    data = run_events.c.data
    query = (
        select(
            run_events.c.id,
            data["attempt"].as_integer(),
            data["start"].as_integer(),
            data["count"].as_integer(),
        )
        .where(
            run_events.c.run_id == run_id,
            run_events.c.type == EVAL_ITEMS_EVENT,
            data["task"].as_string() == task,
        )
        .order_by(run_events.c.id)
    )
    with read_transaction(store.engine) as conn:
        rows = conn.execute(query).all()
    latest = max((attempt for _, attempt, _, _ in rows), default=None)
    chunks = {start: (i, start, count) for i, attempt, start, count in rows if attempt == latest}
    return [chunks[start] for start in sorted(chunks)]

"""Reading eval scores back from the run database (docs/evals.md, "Reading the results").

Two readers, one per question: what a run's log holds of each task's newest scores (the
webhooks' payload), and which finished evaluations scored a checkpoint (an export's model
card). Both read what the evaluate runs wrote (worker/kinds/evaluate.py): metrics events of kind
`eval` on the evaluate run and on the train run that saved the checkpoint, and each evaluate
run's result.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from trainctl.store.db.runs import RunStore
from trainctl.store.db.schema import read_transaction, run_events, runs
from trainctl.store.evals.tasks import EVAL_KIND, EvalResult, TaskScores, split_metric_name


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

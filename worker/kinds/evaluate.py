"""Evaluate runs: a checkpoint's model, with its own tokenizer, scored on downstream tasks
(docs/design/kinds.md, "Run kinds"; docs/evals.md).

The model is loaded as a sample run loads it (`load_for_generation`: the built-in GPT, a
transformers architecture or a plug-in model, its files checked against the manifest), each
task's first `limit` items are read from the shipped data, their few-shot contexts built as
the harness builds them, and `worker.evals.scorer` scores them. Each task's scores are a
metrics event `{"kind": "eval", "step": <the checkpoint's step>, "eval/<task>/<metric>": ...}`
on the evaluate run as the task finishes, after its items' predictions (`eval_items` events,
store.evals.items); when all are done, one event with every score goes
to the train run that wrote the checkpoint too (if it is still listed), so its history shows
how its checkpoints score. A cancel stops the scoring within a batch (`worker.stops`); the
tasks scored by then are the stopped run's result.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from trainctl.store.checkpoints.info import check_fits
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.codec import TextCodec
from trainctl.store.evals.items import item_events, item_record
from trainctl.store.evals.tasks import EVAL_KIND, EVAL_TASKS, EvalTask, metric_name
from trainctl.store.exceptions import RunNotFound
from trainctl.store.kinds.evaluate import EvaluatePlan
from trainctl.worker.context import RunContext
from trainctl.worker.evals.fewshot import build_contexts
from trainctl.worker.evals.scorer import ItemScore, score_items, task_metrics
from trainctl.worker.evals.tasks import read_items
from trainctl.worker.exceptions import RunStopped
from trainctl.worker.executor import Outcome, WorkerEnv, check_device, read_plan, stopped_outcome
from trainctl.worker.models import LanguageModel
from trainctl.worker.models.generation import load_for_generation


def score_task(
    model: LanguageModel, codec: TextCodec, task: EvalTask, plan: EvaluatePlan
) -> tuple[dict[str, Any], list[ItemScore]]:
    """One task's metrics over its first `plan.limit` items (and how many items they are),
    and each item's scores."""
    items = read_items(task)[: plan.limit]
    pool = read_items(task, task.fewshot_split) if plan.num_fewshot else []
    contexts = build_contexts(task, items, pool, plan.num_fewshot, plan.seed)
    scores = score_items(model, codec, items, contexts, batch_size=plan.batch_size)
    return {"items": len(items), **task_metrics(scores)}, scores


def record_items(ctx: RunContext, task: str, scores: list[ItemScore]) -> None:
    """Each item's prediction, as `eval_items` events of this attempt (store.evals.items)."""
    records = [
        item_record(i, s.loglikelihoods, s.pred, s.pred_norm, s.gold) for i, s in enumerate(scores)
    ]
    for data in item_events(task, ctx.attempt, records):
        ctx.eval_items(data)


def run_evaluate(
    plan: EvaluatePlan, ctx: RunContext, store: CheckpointStore, device: torch.device
) -> tuple[dict[str, Any], bool]:
    """Score the plan's checkpoint on its tasks: the run's result, and whether every task
    was scored (False: stopped between tasks)."""
    ref = plan.checkpoint
    info = store.get(ref.experiment, ref.tag)
    # 'best' and 'latest' are pinned to a tag that a later save may replace: the model must
    # still be the one submit checked.
    check_fits(info.require_model_config(), plan.model, f"checkpoint {ref}")
    model, codec = load_for_generation(store, info, device=device)
    if codec is None or info.tokenizer != plan.tokenizer.id:
        raise RuntimeError(f"checkpoint {ref} no longer records the tokenizer it had at submit")
    ctx.log(f"evaluating checkpoint {ref} (step {info.step}) on {', '.join(plan.tasks)}")
    started, scored, items = time.perf_counter(), {}, 0
    for name in plan.tasks:
        try:
            scored[name], scores = score_task(model, codec, EVAL_TASKS[name], plan)
        except RunStopped:  # the scorer stops per batch (worker.stops); the tasks done stay
            break
        record_items(ctx, name, scores)
        items += scored[name]["items"]
        ctx.metrics({"kind": EVAL_KIND, "step": info.step, **event_metrics(name, scored[name])})
    seconds = time.perf_counter() - started
    complete = len(scored) == len(plan.tasks)
    if complete and info.run_id is not None:
        maybe_record_on_source(ctx, info.run_id, info.step, scored)
    result = {
        "checkpoint": {"experiment": ref.experiment, "tag": ref.tag, "step": info.step},
        "source_run": info.run_id,
        "tasks": scored,
        "num_fewshot": plan.num_fewshot,
        "limit": plan.limit,
        "seed": plan.seed,
        "items_per_sec": items / seconds if seconds > 0 else None,
    }
    return result, complete


def event_metrics(task: str, scores: dict[str, Any]) -> dict[str, float]:
    return {metric_name(task, k): v for k, v in scores.items() if k != "items"}


def maybe_record_on_source(
    ctx: RunContext, run_id: str, step: int | None, scored: dict[str, dict[str, Any]]
) -> None:
    """Every score as one metrics event of the train run that wrote the checkpoint; none
    where that run is gone (deleted with its history) or is this run."""
    if run_id == ctx.run.id:
        return
    data: dict[str, Any] = {"kind": EVAL_KIND, "step": step, "evaluate_run": ctx.run.id}
    for name, scores in scored.items():
        data |= event_metrics(name, scores)
    try:
        ctx.runs.append_event(run_id, "metrics", data)
    except RunNotFound:
        ctx.log(f"the run {run_id} that wrote the checkpoint is gone; scores kept here only")


def execute_evaluate(ctx: RunContext, env: WorkerEnv) -> Outcome:
    plan = read_plan(ctx, EvaluatePlan)
    store = env.stores.checkpoints
    result, complete = run_evaluate(plan, ctx, store, check_device(plan.device))
    return Outcome("succeeded", result) if complete else stopped_outcome(ctx, result)

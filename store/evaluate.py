"""Resolving an evaluate request into its plan at submit (docs/architecture.md, "Run kinds",
"Requests and plans"; docs/evals.md).

The checkpoint is pinned as validate, sample and export pin theirs (`store.resolve`), and
what cannot work is a 422 now rather than a failed run: a task the catalog lacks, one named
twice, more few-shot examples than a task has, a checkpoint that records no tokenizer (its
tokens' text is unknown, so no task can be encoded). A byte-level checkpoint is scored on
bytes, which encode any text.
"""

from __future__ import annotations

from collections import Counter

from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.evals import (
    EvaluateOptions,
    EvaluatePlan,
    EvaluateRequest,
    check_fewshot,
    get_task,
)
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.plans import CheckpointRef
from trainctl.store.resolve import (
    SubmitContext,
    checkpoint_codec,
    chosen_checkpoint,
    pick_device,
    tokenizer_pin,
)


def resolve_evaluate(
    request: EvaluateRequest, *, cuda_available: bool, checkpoints: CheckpointStore
) -> EvaluatePlan:
    """Checks the tasks against the catalog, pins the checkpoint and its tokenizer."""
    twice = [name for name, n in Counter(request.tasks).items() if n > 1]
    if twice:
        raise InvalidRequest(f"tasks: {', '.join(map(repr, twice))} named more than once")
    for name in request.tasks:
        try:
            task = get_task(name)
        except InvalidRequest as exc:
            raise InvalidRequest(f"tasks: {exc}") from None
        check_fewshot(task, request.num_fewshot)
    device = pick_device(request.device, cuda_available)
    info = chosen_checkpoint(checkpoints, request, "evaluate")
    config = info.require_model_config()
    pin = tokenizer_pin(info, checkpoint_codec(checkpoints, info))
    if pin is None:
        raise InvalidRequest(
            f"checkpoint {info.experiment}/{info.tag} records no tokenizer (it was trained on "
            "synthetic tokens or bare shards), so the tasks' text cannot be encoded for it; "
            "evaluate a checkpoint trained on a dataset, stdlib or text"
        )
    return EvaluatePlan(
        **{name: getattr(request, name) for name in EvaluateOptions.model_fields},
        checkpoint=CheckpointRef(experiment=info.experiment, tag=info.tag),
        model=config,
        tokenizer=pin,
        device=device,
    )


def plan_evaluate(request: EvaluateRequest, ctx: SubmitContext) -> EvaluatePlan:
    return resolve_evaluate(request, cuda_available=ctx.cuda_available, checkpoints=ctx.checkpoints)

"""Resolving an evaluate request into its plan at submit (docs/design/kinds.md, "Run kinds",
"Requests and plans"; docs/evals.md).

The checkpoint is pinned as validate, sample and export pin theirs (`store.resolve`), and
what cannot work is a 422 now rather than a failed run: a task the catalog lacks, one named
twice, more few-shot examples than a task has, a checkpoint that records no tokenizer (its
tokens' text is unknown, so no task can be encoded). A byte-level checkpoint is scored on
bytes, which encode any text.
"""

from __future__ import annotations

from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.evals.tasks import (
    EvaluateOptions,
    EvaluatePlan,
    EvaluateRequest,
    check_tasks,
    require_tokenizer,
)
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
    check_tasks(request)
    device = pick_device(request.device, cuda_available)
    info = chosen_checkpoint(checkpoints, request, "evaluate")
    config = info.require_model_config()
    pin = require_tokenizer(
        tokenizer_pin(info, checkpoint_codec(checkpoints, info)),
        f"checkpoint {info.experiment}/{info.tag}",
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

"""The evaluate run kind (docs/design/kinds.md, "Run kinds"; docs/evals.md): a checkpoint
scored on downstream tasks; its request, plan, resolver, memory need and record. The task
catalog its requests name, and the checks a train run's `evals` shares, are
`store.evals.tasks`.

The checkpoint is pinned as validate, sample and export pin theirs (`store.resolve`), and
what cannot work is a 422 now rather than a failed run: a task the catalog lacks, one named
twice, more few-shot examples than a task has, a checkpoint that records no tokenizer (its
tokens' text is unknown, so no task can be encoded). A byte-level checkpoint is scored on
bytes, which encode any text. The modules that read the checkpoint are imported where the
resolver runs, not at the top: the CLI imports this module for the request alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from trainctl.store.evals.tasks import check_tasks, require_tokenizer
from trainctl.store.kinds.base import RunKind, one_device
from trainctl.store.plans import CheckpointRef, Device, ReadsCheckpoint, TokenizerPin
from trainctl.store.registry import Ref
from trainctl.store.specs import CheckpointChoice, DeviceChoice, EvaluateOptions, Request
from trainctl.store.training import memory

if TYPE_CHECKING:
    from trainctl.store.checkpoints.store import CheckpointStore
    from trainctl.store.resolve import SubmitContext


class EvaluateRequest(EvaluateOptions, CheckpointChoice, Request):
    device: DeviceChoice = Field("auto", description="Where to run.")


class EvaluatePlan(EvaluateOptions, ReadsCheckpoint):
    tokenizer: TokenizerPin = Field(
        description="The checkpoint's tokenizer, which encodes the tasks' text (bytes for a "
        "byte-level checkpoint)."
    )
    device: Device


def resolve_evaluate(
    request: EvaluateRequest, *, cuda_available: bool, checkpoints: CheckpointStore
) -> EvaluatePlan:
    """Checks the tasks against the catalog, pins the checkpoint and its tokenizer."""
    # Imported when it runs, not above: see the module's docstring.
    from trainctl.store.resolve import (
        checkpoint_codec,
        chosen_checkpoint,
        pick_device,
        tokenizer_pin,
    )

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


def evaluate_need(plan: EvaluatePlan, params: int | None = None) -> memory.MemoryNeed:
    # A batch's rows are at most the model's context long (the scorer left-truncates them).
    estimate = memory.estimate_peak(
        plan.model,
        device=plan.device,
        micro_batch_size=plan.batch_size,
        seq_len=plan.model.max_seq_len,
        training=False,
        params=params,
    )
    return memory.MemoryNeed(estimate, 1, plan.device, "this evaluation", plan.model)


EVALUATE = RunKind(
    name="evaluate",
    request=EvaluateRequest,
    plan=EvaluatePlan,
    summary="Queue an evaluation of a checkpoint on downstream tasks (GET /evals/tasks); "
    "the scores are `eval/<task>/<metric>` metrics events and the run's result.",
    resolve=Ref(f"{__name__}:plan_evaluate"),
    placement=one_device,
    memory=evaluate_need,
    has_steps=False,
    executor="evaluate",
)

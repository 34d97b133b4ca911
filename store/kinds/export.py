"""The export run kind (docs/design/kinds.md, "Run kinds"; docs/design/models.md, "Model output:
samples, sample runs, exports"): a checkpoint written as a Hugging Face transformers folder into the
exports store; its request, plan, resolver and record. It reads one checkpoint on a CPU, so it has
no memory need.

Resolution reads the checkpoints and the data; the modules that read them are imported where
the resolver runs, not at the top: the CLI imports this module for the request alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from trainctl.store.exceptions import ExportExists, InvalidRequest
from trainctl.store.kinds.base import RunKind, one_cpu
from trainctl.store.models.hf_config import HfModelConfig
from trainctl.store.models.plugin import PluginModelConfig
from trainctl.store.plans import CheckpointRef, ReadsCheckpoint
from trainctl.store.registry import Ref
from trainctl.store.specs import EXPORT_DTYPES, CheckpointChoice, ExportDtype, Request
from trainctl.store.vocabulary import ACTIVE_STATES

if TYPE_CHECKING:
    from trainctl.store.checkpoints.store import CheckpointStore
    from trainctl.store.db.runs import RunStore
    from trainctl.store.resolve import SubmitContext


class ExportRequest(CheckpointChoice, Request):
    format: Literal["hf"] = Field(
        "hf",
        description="hf: a Hugging Face transformers folder (config.json, model.safetensors, "
        "generation_config.json, tokenizer files, a model card) that "
        "AutoModelForCausalLM.from_pretrained loads without trust_remote_code.",
    )
    dtype: ExportDtype = Field(
        "float32",
        description=f"The weights' dtype in model.safetensors: {' or '.join(EXPORT_DTYPES)}.",
    )


class ExportPlan(ReadsCheckpoint):
    format: Literal["hf"] = Field(description="hf: a Hugging Face transformers folder.")
    dtype: ExportDtype = Field(description="The exported weights' dtype.")
    output: str = Field(
        description="Where the export goes, in the exports store's words: its folder "
        "(<data dir>/exports/<experiment>/<tag>) or its place in the bucket (s3://...)."
    )


def resolve_export(
    request: ExportRequest, *, checkpoints: CheckpointStore, exports: CheckpointStore
) -> ExportPlan:
    """Pins the checkpoint, refuses a model that the format cannot express, and names the
    export's place in the exports store (a folder, or a prefix of the bucket), which must not
    be taken yet (an export is never overwritten)."""
    # Imported when it runs, not above: see the module's docstring.
    from trainctl.store.checkpoints.exports import check_exportable
    from trainctl.store.resolve import chosen_checkpoint

    info = chosen_checkpoint(checkpoints, request, "export")
    config = info.require_model_config()
    if isinstance(config, PluginModelConfig):
        raise InvalidRequest(
            f"checkpoint {info.experiment}/{info.tag} holds the plug-in model "
            f"{config.plugin!r}, which has no transformers form to export to"
        )
    if not isinstance(config, HfModelConfig):  # a transformers model exports as it is
        check_exportable(config)
    if exports.taken(info.experiment, info.tag):
        raise ExportExists(
            f"checkpoint {info.experiment}/{info.tag} is already exported (GET /exports/"
            f"{info.experiment}/{info.tag}); delete that export first to export it again"
        )
    return ExportPlan(
        checkpoint=CheckpointRef(experiment=info.experiment, tag=info.tag),
        model=config,
        format=request.format,
        dtype=request.dtype,
        output=exports.describe(info.experiment, info.tag),
    )


def plan_export(request: ExportRequest, ctx: SubmitContext) -> ExportPlan:
    plan = resolve_export(request, checkpoints=ctx.checkpoints, exports=ctx.exports)
    refuse_a_second_export(ctx.runs, plan)
    return plan


def refuse_a_second_export(runs: RunStore, plan: ExportPlan) -> None:
    """Like a prepare: two exports of one checkpoint would race to publish one folder."""
    ref = plan.checkpoint
    for state in ACTIVE_STATES:
        active, _ = runs.list_runs(kind="export", state=state, experiment=ref.experiment, limit=500)
        for run in active:
            if run.spec.get("output") == plan.output:
                raise ExportExists(
                    f"checkpoint {ref} is being exported by run {run.id} ({state}); wait for "
                    "it, or cancel it"
                )


EXPORT = RunKind(
    name="export",
    request=ExportRequest,
    plan=ExportPlan,
    summary="Queue an export of a checkpoint to a Hugging Face transformers folder, "
    "served under /exports/{experiment}/{tag}.",
    resolve=Ref(f"{__name__}:plan_export"),
    placement=one_cpu,
    memory=None,  # reads one checkpoint on a CPU
    has_steps=False,
    executor="export",
)

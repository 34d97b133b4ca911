"""The validate run kind (docs/design/kinds.md, "Run kinds"): a checkpoint's loss on held-out
data encoded with its tokenizer; its request, plan, resolver, memory need and record.

Resolution reads the checkpoints and the data; the modules that read them are imported where
the resolver runs, not at the top: the CLI imports this module for the request alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, StrictInt, field_validator

from trainctl.store.checkpoints.info import check_same_tokenizer
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.kinds.base import RunKind, one_device
from trainctl.store.plans import CheckpointRef, DatasetPin, Device, ReadsCheckpoint, data_tokenizer
from trainctl.store.registry import Ref
from trainctl.store.specs import CheckpointChoice, DataSpec, DeviceChoice, Request, Spec
from trainctl.store.training.memory import MemoryNeed, estimate_peak

if TYPE_CHECKING:
    from trainctl.store.checkpoints.store import CheckpointStore
    from trainctl.store.data.bucket import DatasetStore
    from trainctl.store.resolve import SubmitContext


class ValidateOptions(Spec):
    data: DataSpec = Field(default_factory=DataSpec, description="Validation data.")
    batch_size: StrictInt = Field(4, ge=1, le=4096, description="Sequences per batch.")
    num_batches: StrictInt = Field(8, ge=1, le=100_000, description="Batches to average over.")

    @field_validator("data")
    @classmethod
    def _one_dataset(cls, v: DataSpec) -> DataSpec:
        if v.source == "mixture":
            raise ValueError(
                "a validate run reads one source, not a mixture: validate the checkpoint on "
                "each of the mixture's datasets (source 'dataset'), for a loss per dataset"
            )
        return v


class ValidateRequest(ValidateOptions, CheckpointChoice, Request):
    seq_len: StrictInt | None = Field(None, ge=8, le=131_072, description="Default: profile's.")
    device: DeviceChoice = Field("auto", description="Where to run.")


class ValidatePlan(ValidateOptions, ReadsCheckpoint):
    dataset: DatasetPin | None = Field(description="The dataset data.dataset names, pinned.")
    seq_len: StrictInt = Field(ge=1, description="Tokens per sequence.")
    device: Device


def resolve_validate(
    request: ValidateRequest,
    *,
    cuda_available: bool,
    data_roots: list[Path],
    checkpoints: CheckpointStore,
    datasets: DatasetStore | None = None,
) -> ValidatePlan:
    """Pins 'latest', 'best' or 'exp/tag' to one checkpoint now, and takes its model; the
    data must be encoded with the tokenizer the checkpoint was trained with."""
    # Imported when it runs, not above: see the module's docstring.
    from trainctl.store.data.contents import check_enough_tokens
    from trainctl.store.data.pins import check_vocabulary, data_plan
    from trainctl.store.resolve import (
        TRAIN_PROFILES,
        chosen_checkpoint,
        pick_device,
        shared_options,
    )

    device = pick_device(request.device, cuda_available)
    info = chosen_checkpoint(checkpoints, request, "validate")
    config = info.require_model_config()
    seq_len = request.seq_len or min(TRAIN_PROFILES[device].seq_len, config.max_seq_len)
    if seq_len > config.max_seq_len:
        raise InvalidRequest(
            f"seq_len {seq_len} is above the checkpoint model's max_seq_len {config.max_seq_len}"
        )
    resolved = data_plan(request.data, data_roots, datasets)
    data, dataset = resolved.data, resolved.dataset  # one source: ValidateOptions' rule
    for field, arrays in resolved.arrays:
        check_enough_tokens(arrays, data.val_fraction, seq_len, field, validation_only=True)
    source = f"checkpoint {info.experiment}/{info.tag}"
    for field, pin in resolved.pins:
        check_vocabulary(
            field,
            pin,
            config.vocab_size,
            f"the vocab_size of {source}'s model, {config.vocab_size:,}",
        )
    check_same_tokenizer(info, data_tokenizer(data, dataset), "data")
    return ValidatePlan(
        **shared_options(request, ValidateOptions) | {"data": data},
        dataset=dataset,
        checkpoint=CheckpointRef(experiment=info.experiment, tag=info.tag),
        model=config,
        seq_len=seq_len,
        device=device,
    )


def plan_validate(request: ValidateRequest, ctx: SubmitContext) -> ValidatePlan:
    return resolve_validate(
        request,
        cuda_available=ctx.cuda_available,
        data_roots=ctx.data_roots,
        checkpoints=ctx.checkpoints,
        datasets=ctx.datasets,
    )


def validate_need(plan: ValidatePlan, params: int | None = None) -> MemoryNeed:
    estimate = estimate_peak(
        plan.model,
        device=plan.device,
        micro_batch_size=plan.batch_size,
        seq_len=plan.seq_len,
        training=False,
        params=params,
    )
    return MemoryNeed(estimate, 1, plan.device, "this validation", plan.model)


VALIDATE = RunKind(
    name="validate",
    request=ValidateRequest,
    plan=ValidatePlan,
    summary="Queue a validation of a checkpoint, pinned now to a concrete experiment/tag.",
    resolve=Ref(f"{__name__}:plan_validate"),
    placement=one_device,
    memory=validate_need,
    has_steps=False,
    executor="validate",
)

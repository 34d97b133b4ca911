"""The sample run kind (docs/design/kinds.md, "Run kinds"; docs/design/models.md, "Model output:
samples, sample runs, exports"): prompts continued by a checkpoint; its request, plan, resolver,
memory need and record.

Resolution reads the checkpoints and the data; the modules that read them are imported where
the resolver runs, not at the top: the CLI imports this module for the request alone.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated

from pydantic import Field, StrictInt, model_validator

from trainctl.store.exceptions import InvalidRequest
from trainctl.store.kinds.base import RunKind, one_device
from trainctl.store.models.generation import GenerationSettings, check_context
from trainctl.store.models.presets import BOUNDS
from trainctl.store.plans import CheckpointRef, Device, ReadsCheckpoint, TokenizerPin
from trainctl.store.registry import Ref
from trainctl.store.specs import CheckpointChoice, DeviceChoice, Prompt, Request
from trainctl.store.training.memory import MemoryNeed, estimate_peak

if TYPE_CHECKING:
    from trainctl.store.checkpoints.store import CheckpointStore
    from trainctl.store.resolve import SubmitContext


# Prompts of one sample run (each one is decoded every time).
MAX_PROMPTS = 64
MAX_PROMPT_TOKENS = 131_072  # the longest context (store.models.presets.BOUNDS)
TokenId = Annotated[StrictInt, Field(ge=0, lt=int(BOUNDS["vocab_size"][1]))]
"""A token id: below the largest vocabulary (the model's own is checked at submit)."""


class SampleRequest(CheckpointChoice, Request):
    prompts: list[Prompt] | None = Field(
        None,
        min_length=1,
        max_length=MAX_PROMPTS,
        description="Texts to continue, encoded with the checkpoint's tokenizer (a byte-level "
        "checkpoint's: UTF-8 bytes). A checkpoint that records no tokenizer takes "
        "`prompt_tokens` instead.",
    )
    prompt_tokens: list[list[TokenId]] | None = Field(
        None,
        min_length=1,
        max_length=MAX_PROMPTS,
        description="Token ids to continue, one list per prompt, each id below the model's "
        "vocab_size; the completions are token ids then (and text too where the checkpoint's "
        "tokenizer is known).",
    )
    generation: GenerationSettings = Field(
        default_factory=GenerationSettings, description="How to sample, where to stop."
    )
    device: DeviceChoice = Field("auto", description="Where to run.")

    @model_validator(mode="after")
    def _one_kind_of_prompt(self) -> SampleRequest:
        if (self.prompts is None) == (self.prompt_tokens is None):
            raise ValueError("give either prompts (text) or prompt_tokens (token ids), not both")
        for ids in self.prompt_tokens or []:
            if not 1 <= len(ids) <= MAX_PROMPT_TOKENS or min(ids) < 0:
                raise ValueError(
                    f"each of prompt_tokens must hold 1 to {MAX_PROMPT_TOKENS:,} token ids, "
                    "none negative"
                )
        return self


class SamplePlan(ReadsCheckpoint):
    tokenizer: TokenizerPin | None = Field(
        description="The checkpoint's tokenizer; null where it records none (token ids only)."
    )
    prompts: list[str] | None = Field(description="The prompts as sent, if text.")
    prompt_tokens: list[list[StrictInt]] = Field(description="Each prompt's token ids.")
    generation: GenerationSettings = Field(description="How to sample, where to stop.")
    device: Device


def resolve_sample(
    request: SampleRequest, *, cuda_available: bool, checkpoints: CheckpointStore
) -> SamplePlan:
    """Pins the checkpoint and encodes the prompts with its tokenizer now, so that a prompt
    or a length that cannot work is a 422, not a failed run."""
    # Imported when it runs, not above: see the module's docstring.
    from trainctl.store.resolve import (
        checkpoint_codec,
        chosen_checkpoint,
        pick_device,
        tokenizer_pin,
    )

    device = pick_device(request.device, cuda_available)
    info = chosen_checkpoint(checkpoints, request, "sample from")
    config = info.require_model_config()
    codec = checkpoint_codec(checkpoints, info)
    source = f"checkpoint {info.experiment}/{info.tag}"
    if request.prompts is not None:
        if codec is None:
            raise InvalidRequest(
                f"prompts: {source} records no tokenizer (it was trained on synthetic tokens "
                "or bare shards), so it cannot encode text or decode its completions; send "
                "prompt_tokens (token ids) instead"
            )
        tokens = [codec.encode(p) for p in request.prompts]
    else:
        tokens = request.prompt_tokens or []
        check_token_ids(tokens, config.vocab_size, "prompt_tokens", source)
    for i, ids in enumerate(tokens):
        where = f"prompt {i}" if len(tokens) > 1 else "prompt"
        try:
            check_context(len(ids), request.generation.max_new_tokens, config.max_seq_len)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{where}: {exc} ({source})") from None
    return SamplePlan(
        checkpoint=CheckpointRef(experiment=info.experiment, tag=info.tag),
        model=config,
        tokenizer=tokenizer_pin(info, codec),
        prompts=request.prompts,
        prompt_tokens=tokens,
        generation=request.generation,
        device=device,
    )


def check_token_ids(tokens: list[list[int]], vocab_size: int, field: str, source: str) -> None:
    for i, ids in enumerate(tokens):
        if ids and max(ids) >= vocab_size:
            raise InvalidRequest(
                f"{field}[{i}]: token id {max(ids)} is not below the vocab_size of {source}'s "
                f"model, {vocab_size:,}"
            )


def plan_sample(request: SampleRequest, ctx: SubmitContext) -> SamplePlan:
    return resolve_sample(request, cuda_available=ctx.cuda_available, checkpoints=ctx.checkpoints)


def sample_need(plan: SamplePlan, params: int | None = None) -> MemoryNeed:
    # Every prompt decodes at once, over at most the whole context: a validation's forward
    # of that batch, and the keys and values of every layer kept for it.
    longest = max(len(p) for p in plan.prompt_tokens) + plan.generation.max_new_tokens
    estimate = estimate_peak(
        plan.model,
        device=plan.device,
        micro_batch_size=len(plan.prompt_tokens),
        seq_len=longest,
        training=False,
        params=params,
    )
    sizes = plan.model.sizes()
    kv, layers = sizes["kv"], sizes["cache_layers"]
    cache = 2 * layers * len(plan.prompt_tokens) * longest * kv * 4
    estimate = dataclasses.replace(estimate, activations=estimate.activations + cache)
    return MemoryNeed(estimate, 1, plan.device, "this sample run", plan.model)


SAMPLE = RunKind(
    name="sample",
    request=SampleRequest,
    plan=SamplePlan,
    summary="Queue a sample run: continue prompts with a checkpoint; the completions "
    "stream as `sample` events and are the run's result.",
    resolve=Ref(f"{__name__}:plan_sample"),
    placement=one_device,
    memory=sample_need,
    has_steps=False,
    executor="sample",
)

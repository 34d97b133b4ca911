"""Admission at claim: a transformers or plug-in model's real parameter count against this
worker's memory (docs/design/kinds.md, "Requests and plans").

Submit has no torch, so its memory estimate for such a model counts parameters from the
config's widths (store.training.memory), which can be far off (experts, latent attention, a
plug-in's own layers). The worker that claims the run builds the model on the meta device,
which allocates nothing, counts its parameters, and puts that count through the same
estimate (`train_need`, `benchmark_need`: the same bytes per parameter). A run that does not
fit fails before any step with both numbers. It fails rather than going back to the queue:
every worker counts the same parameters, so a run that fits no worker would cycle between
them forever, and one that fits a larger worker says so in its error (submit it again with a
smaller batch, or where that worker alone serves it). Failing costs no attempt: attempts
count lost workers, not errors (docs/design/runs.md, "Runs", "Attempts").
"""

from __future__ import annotations

import torch

from trainctl.store.kinds.registry import kind_of_plan
from trainctl.store.models.hf_config import HfModelConfig
from trainctl.store.models.plugin import PluginModelConfig
from trainctl.store.plans import Plan
from trainctl.store.training.memory import gib, node_bytes
from trainctl.worker.exceptions import DoesNotFit
from trainctl.worker.models import build_model


def count_params(config: HfModelConfig | PluginModelConfig) -> int:
    """The model's parameters, built on the meta device (shapes only, no memory); a tied
    tensor once."""
    with torch.device("meta"):
        model = build_model(config, device="meta")
    return sum(p.numel() for p in model.parameters())


def admit_at_claim(plan: Plan, memory_bytes: int | None) -> int | None:
    """The real parameter count of the plan's transformers or plug-in model, for every kind
    whose memory is estimated (None for the built-in GPT, whose count submit already has
    exactly, and for kinds bounded by construction); raises DoesNotFit naming it and the
    memory needed against `memory_bytes`, this worker's (None: no limit known)."""
    measure = kind_of_plan(plan).memory
    if measure is None:  # bounded by construction
        return None
    config = measure(plan, None).config
    if not isinstance(config, HfModelConfig | PluginModelConfig):
        return None
    params = count_params(config)
    need = measure(plan, params)
    total = node_bytes(need.estimate, need.processes, need.device)
    if memory_bytes is not None and total > memory_bytes:
        raise DoesNotFit(
            f"{need.what} does not fit this worker: its model has {params:,} parameters "
            f"(counted when built), so it needs about {gib(total)}, {total:,} bytes "
            f"({need.estimate.describe()}), more than the {memory_bytes:,} bytes "
            f"({gib(memory_bytes)}) this worker has; use a smaller "
            "micro_batch_size or seq_len, activation checkpointing, or a smaller model"
        )
    return params

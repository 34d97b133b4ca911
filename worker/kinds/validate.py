"""Validate runs, torch half (docs/design/kinds.md, "Run kinds"): a checkpoint's loss on the
held-out data a train run on the same source validates on; the request, plan and resolver
are store/kinds/validate.py.
"""

from __future__ import annotations

from typing import Any

import torch

from trainctl.store.data.bucket import DatasetStore
from trainctl.store.kinds.validate import ValidatePlan
from trainctl.store.plans import bytes_per_token
from trainctl.worker.checkpoints.state import load_checkpoint
from trainctl.worker.context import RunContext
from trainctl.worker.data.loader import SyntheticSampler, TokenSampler
from trainctl.worker.executor import Outcome, WorkerEnv, check_device, read_plan
from trainctl.worker.models import build_model
from trainctl.worker.stops import maybe_stop
from trainctl.worker.training.loop import build_token_arrays, val_metrics
from trainctl.worker.training.validation import compute_validation_loss, validate_forward_shape


def validation_batches(plan: ValidatePlan, datasets: DatasetStore) -> list[Any]:
    data, vocab_size = plan.data, plan.model.vocab_size
    if data.source == "synthetic":
        sampler: Any = SyntheticSampler(plan.batch_size, plan.seq_len, vocab_size, data.seed)
    else:
        # Same held-out data a train run on this source validates on.
        _, val_arrays = build_token_arrays(data, plan.dataset, datasets)
        sampler = TokenSampler(val_arrays, plan.batch_size, plan.seq_len, seed=data.seed + 1)
    batches = []
    for i in range(plan.num_batches):
        maybe_stop()
        batches.append(sampler.batch(i))
    return batches


def execute_validate(ctx: RunContext, env: WorkerEnv) -> Outcome:
    plan = read_plan(ctx, ValidatePlan)
    store = env.stores.checkpoints
    device = check_device(plan.device)
    ref = plan.checkpoint
    info = store.get(ref.experiment, ref.tag)
    ctx.log(f"validating checkpoint {ref} (step {info.step})")
    model = build_model(plan.model, device=device)
    load_checkpoint(model, None, None, store.entry(ref.experiment, ref.tag), device=device)
    shape = validate_forward_shape(model, device=device)
    autocast = torch.bfloat16 if device.type == "cuda" else None
    batches = validation_batches(plan, env.stores.datasets)
    val = compute_validation_loss(model, batches=batches, device=device, autocast_dtype=autocast)
    metrics = val_metrics(val, bytes_per_token(plan.data, plan.dataset))
    ctx.metrics({"kind": "val", **metrics})
    if "val_bits_per_byte" in metrics:
        val = {**val, "bits_per_byte": metrics["val_bits_per_byte"]}
    return Outcome(
        "succeeded",
        {
            **val,
            "checkpoint": {"experiment": ref.experiment, "tag": ref.tag, "step": info.step},
            "forward_shape": list(shape),
        },
    )

"""Executes one claimed run of each kind with the training core and says how it ended.

An `Outcome` is what the worker loop then writes to the store: succeeded, cancelled, requeued
(graceful shutdown) or abandoned (the lease was lost, so the run is no longer ours to touch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from store.checkpoints import CheckpointInfo, CheckpointStore, parse_step
from store.specs import BenchmarkSpec, TrainSpec, ValidateSpec
from worker.benchmark import run_benchmark
from worker.checkpoint import load_checkpoint, read_metadata
from worker.context import RunContext
from worker.data import SyntheticSampler, TokenSampler
from worker.distributed import launch_train
from worker.model import build_model
from worker.train import Trainer, build_token_arrays
from worker.validation import compute_validation_loss, validate_forward_shape


@dataclass
class Outcome:
    state: Literal["succeeded", "cancelled", "requeue", "abandoned"]
    result: dict[str, Any] | None = None
    reason: str = ""


def stopped_outcome(ctx: RunContext, result: dict[str, Any]) -> Outcome:
    reason = ctx.stop_reason()
    if reason == "cancel":
        return Outcome("cancelled", result, "cancelled at the user's request")
    if reason == "shutdown":
        return Outcome("requeue", result, "worker shutting down; the run continues later")
    return Outcome("abandoned", result, "lease lost")


def check_device(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the run needs a CUDA device but this worker has none")
    return torch.device("cuda" if device == "cuda" else "cpu")


def own_latest_checkpoint(
    store: CheckpointStore, experiment: str, run_id: str
) -> CheckpointInfo | None:
    """The newest step checkpoint this run wrote itself (in an earlier attempt), if any."""
    mine = [c for c in store.list(experiment) if c.run_id == run_id and parse_step(c.tag)]
    return max(mine, key=lambda c: c.step or 0, default=None)


def execute_train(ctx: RunContext, root: Path) -> Outcome:
    spec = TrainSpec.model_validate(ctx.run.spec)
    check_device(spec.device)
    store = CheckpointStore(root)
    # A run that was interrupted (worker killed, node drained) continues from its own last
    # checkpoint; the steps after it are recomputed, deterministically, from the same batches.
    previous = own_latest_checkpoint(store, spec.experiment, ctx.run.id)
    if previous is not None:
        spec = spec.model_copy(update={"resume_from": previous.tag})
        ctx.log(f"attempt {ctx.attempt}: resuming from {previous.tag} of this run")
    elif spec.resume_from:
        ctx.log(f"resuming from checkpoint {spec.experiment}/{spec.resume_from}")

    def on_checkpoint(info: dict[str, Any]) -> None:
        ctx.log(f"saved checkpoint {spec.experiment}/{info['tag']} at step {info['step']}")

    if spec.nproc_per_node > 1:
        ctx.log(f"launching {spec.nproc_per_node} data-parallel processes (torchrun)")
        result = launch_train(spec, root, ctx)
    else:
        trainer = Trainer(
            spec,
            root,
            run_id=ctx.run.id,
            on_metrics=ctx.metrics,
            on_checkpoint=on_checkpoint,
            should_stop=ctx.should_stop,
            protected=ctx.runs.protected_checkpoints,
            before_commit=ctx.confirm_lease,
        )
        result = trainer.run()
    latest = store.latest_or_none(spec.experiment)
    result["experiment"] = spec.experiment
    result["checkpoint"] = latest.tag if latest else None
    ctx.progress(result["step"], spec.steps, force=True)
    return stopped_outcome(ctx, result) if result["stopped"] else Outcome("succeeded", result)


def execute_benchmark(ctx: RunContext, root: Path) -> Outcome:
    spec = BenchmarkSpec.model_validate(ctx.run.spec)
    check_device(spec.device)
    result = run_benchmark(spec, on_step=ctx.metrics, should_stop=ctx.should_stop)
    b = spec.batch
    planned = spec.steps * (b.micro_batch_size or 1) * (b.seq_len or 1) * (b.grad_accum_steps or 1)
    if result["total_tokens"] < planned:
        return stopped_outcome(ctx, result)
    return Outcome("succeeded", result)


def validation_batches(spec: ValidateSpec, vocab_size: int) -> list[Any]:
    assert spec.seq_len is not None, "spec must be resolved"
    data = spec.data
    if data.source == "synthetic":
        sampler: Any = SyntheticSampler(spec.batch_size, spec.seq_len, vocab_size, data.seed)
    else:
        # Same held-out data a train run on this source validates on.
        as_train = TrainSpec(steps=1, data=data)
        _, val_arrays = build_token_arrays(as_train)
        sampler = TokenSampler(val_arrays, spec.batch_size, spec.seq_len, seed=data.seed + 1)
    return [sampler.batch(i) for i in range(spec.num_batches)]


def execute_validate(ctx: RunContext, root: Path) -> Outcome:
    spec = ValidateSpec.model_validate(ctx.run.spec)
    device = check_device(spec.device)
    experiment, tag = spec.checkpoint.split("/")
    info = CheckpointStore(root).get(experiment, tag)
    ctx.log(f"validating checkpoint {experiment}/{tag} (step {info.step})")
    config = read_metadata(info.path).get("model_config")
    if not isinstance(config, dict):
        raise ValueError(f"checkpoint {experiment}/{tag} records no model config")
    model = build_model(config, device=device)
    load_checkpoint(model, None, None, None, info.path, device=device)
    shape = validate_forward_shape(model, device=device)
    batches = validation_batches(spec, model.config.vocab_size)
    autocast = torch.bfloat16 if device.type == "cuda" else None
    val = compute_validation_loss(model, batches=batches, device=device, autocast_dtype=autocast)
    ctx.metrics({"kind": "val", "val_loss": val["loss"], "val_ppl": val["ppl"]})
    return Outcome(
        "succeeded",
        {
            **val,
            "checkpoint": {"experiment": experiment, "tag": tag, "step": info.step},
            "forward_shape": list(shape),
        },
    )


EXECUTORS = {"train": execute_train, "benchmark": execute_benchmark, "validate": execute_validate}


def execute(ctx: RunContext, checkpoint_root: Path) -> Outcome:
    return EXECUTORS[ctx.run.kind](ctx, checkpoint_root)

"""What the multi-process train tests share (test_distributed.py, test_fsdp.py): the tiny
plan they run at 1, 2 and 3 ranks, and how its losses are read and compared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.plans import train_plan
from trainctl.store.kinds.train import TrainPlan

LOSS_RTOL = 1e-4  # measured here: at most 7e-6 over six steps
STEPS = 6


def tiny_plan(checkpoints: Path | None = None, **changes: Any) -> TrainPlan:
    """Four micro-batches of two sequences per step: two per rank with two ranks."""
    defaults: dict[str, Any] = {
        "experiment": "ddp",
        "steps": STEPS,
        "model": {"preset": "tiny"},
        "data": {"source": "synthetic"},
        "batch": {"micro_batch_size": 2, "seq_len": 32, "grad_accum_steps": 4},
        "checkpoint_every": 3,
        "val_batches": 2,
    }
    return train_plan(checkpoints, **(defaults | changes))


def train_losses(metrics: list[dict[str, Any]]) -> list[float]:
    return [m["loss"] for m in metrics if m["kind"] == "train"]

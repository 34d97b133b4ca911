"""What the multi-process tests share: the tiny plan test_distributed.py and test_fsdp.py
run at 1, 2 and 3 ranks, how its losses are read and compared, and `spawn_ranks` for the
tests that run a program of their own on real gloo processes."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.plans import train_plan
from tests.support.ports import free_port
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


def spawn_ranks(
    program: Callable[..., None], world: int, *args: Any, timeout: float = 180
) -> list[int]:
    """Run `program(rank, world, port, *args)` on `world` spawned processes (`port`: a free
    one for their process group); their exit codes, -9 for one killed at `timeout`."""
    port, context = free_port(), multiprocessing.get_context("spawn")
    ranks = [
        context.Process(target=program, args=(rank, world, port, *args)) for rank in range(world)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
    return [p.exitcode if p.exitcode is not None else -9 for p in ranks]

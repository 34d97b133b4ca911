"""The rank programs of tests/worker/checkpoints/test_sharded_checkpoint.py: each runs in a process
of its own (spawned, gloo over 127.0.0.1), trains the `tiny` model sharded with `fully_shard`
per block plus the root, and writes what the test compares (full-state fingerprints) with
torch.save under `out`.
"""

from __future__ import annotations

import os
import signal
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

from tests.support.stores import posix_store
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.training.optim import OptimizerSpec
from trainctl.worker.checkpoints.sharded import capture_sharded, load_sharded, write_sharded
from trainctl.worker.checkpoints.training_state import Progress, TrainingState
from trainctl.worker.models.gpt import GPT, build_model
from trainctl.worker.training.optim import Optimizers, build_optimizers

EXPERIMENT = "sharded"
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def batch(step: int) -> torch.Tensor:
    """The global batch of a step, the same on every rank: a sharded step then equals a
    one-process step on it."""
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, 256, (2, 17), generator=generator)


def build(sharded: bool, seed: int = 0) -> tuple[GPT, Optimizers]:
    model = build_model("tiny", seed=seed)
    if sharded:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        register_fsdp_forward_method(model, "loss")  # training calls loss, not forward
    return model, build_optimizers(model, OptimizerSpec(kind="muon_adamw"))


def train_step(model: nn.Module, optimizers: Optimizers, step: int) -> None:
    data = batch(step)
    loss, _ = model.loss(data[:, :-1], data[:, 1:])  # type: ignore[operator]
    loss.backward()
    optimizers.step()
    optimizers.zero_grad()


def fingerprint(model: nn.Module, optimizers: Optimizers, full: bool) -> dict[str, Any]:
    """The whole model and optimizer state, named as a single process names them (a
    collective when `full`: the slices are gathered)."""
    options = FULL if full else None
    return {
        "model": get_model_state_dict(model, options=options),
        "optimizers": {
            name: get_optimizer_state_dict(model, opt, options=options)
            for name, opt in optimizers.items()
        },
    }


def _start(rank: int, world: int, port: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    torch.manual_seed(rank)


def _save_fingerprint(model: nn.Module, optimizers: Optimizers, path: Path) -> None:
    state = fingerprint(model, optimizers, full=True)
    if dist.get_rank() == 0:
        torch.save(state, path)


def save_program(rank: int, world: int, port: int, root: str, out: str) -> None:
    """Two steps, a sharded save (step_2), the state then and one step later, step_2 loaded
    into a fresh model (`_load_and_step`); then a save of
    step_3 in which rank 1 dies (SIGKILL) once its shards are written, before the ranks
    agree. Rank 0 writes what that save raised."""
    _start(rank, world, port)
    model, optimizers = build(sharded=True)
    store = posix_store(Path(root))
    for step in range(2):
        train_step(model, optimizers, step)
    state = TrainingState(model, optimizers, None, EXPERIMENT, Progress(2, 200))
    write_sharded(capture_sharded(state), store)
    _save_fingerprint(model, optimizers, Path(out) / "saved.pt")
    train_step(model, optimizers, 2)
    _save_fingerprint(model, optimizers, Path(out) / "next.pt")
    _load_and_step(store, world, out)  # at the same world size, in the same ranks

    def die() -> None:
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    staged = capture_sharded(TrainingState(model, optimizers, None, EXPERIMENT, Progress(3, 300)))
    try:
        write_sharded(staged, store, after_write=die)
        outcome = "committed"
    except Exception:
        outcome = traceback.format_exc()
    (Path(out) / f"rank{rank}.txt").write_text(outcome)
    os._exit(0)  # the group lost a rank: no orderly shutdown is possible


def _load_and_step(store: CheckpointStore, world: int, out: str) -> None:
    """A model of other initial weights loads step_2; its state then, and after a step."""
    model, optimizers = build(sharded=True, seed=1)
    load_sharded(model, optimizers, None, store.entry(EXPERIMENT, "step_2"))
    _save_fingerprint(model, optimizers, Path(out) / f"loaded-{world}.pt")
    train_step(model, optimizers, 2)
    _save_fingerprint(model, optimizers, Path(out) / f"stepped-{world}.pt")


def load_program(rank: int, world: int, port: int, root: str, out: str) -> None:
    """step_2 loaded at another world size (`_load_and_step`)."""
    _start(rank, world, port)
    _load_and_step(posix_store(Path(root)), world, out)
    dist.destroy_process_group()

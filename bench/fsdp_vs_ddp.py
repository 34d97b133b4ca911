"""Issue 25, the sharded strategy against the replicated one, on CPU with gloo ranks: what a
rank holds, and its step time.

Each rank builds its part of a train run as the worker does (`worker.training.loop.build_training`
with `worker.training.parallelism.Ranks`: the plan's strategy, Muon + AdamW over its parameters, the
rank's share of the batches) and steps it with the loop's own `train_step`.

- **Memory per rank**, at 2 and 4 ranks, one launch per strategy: the bytes of the
  parameters, their gradients and the optimizer state that the rank holds (a DTensor's local
  shard), counted from the tensors, and the process's peak resident memory above what it held
  before building the model (activations, FSDP's gathered blocks and torch's allocator
  included). Sharded, the first should come near 1/W of the replicated one.
- **Step time** at 2 ranks: both strategies built in the same ranks, their steps alternated
  round by round, each between two barriers (its slowest rank's time); a paired ratio.
"""

from __future__ import annotations

import functools
import os
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from bench.common import Figure, alternate, step_time_figures
from trainctl.store.kinds.train import TrainRequest, resolve_train
from trainctl.worker.training.loop import (
    TrainParts,
    build_data,
    build_training,
    data_loader,
    train_step,
)
from trainctl.worker.training.parallel import RankSampler
from trainctl.worker.training.parallelism import Ranks

# `small`'s shape at a width a CPU steps in about a second (Muon's bf16 Newton-Schulz on
# 768-wide matrices takes tens of seconds a step here).
FULL: dict[str, Any] = dict(
    preset="small",
    overrides=dict(
        d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=768, vocab_size=8192
    ),
    seq=128,
    rounds=5,
    worlds=(2, 4),
)
QUICK: dict[str, Any] = dict(preset="tiny", overrides={}, seq=32, rounds=1, worlds=(2,))
STRATEGIES = ("ddp", "fsdp")


def plan_for(strategy: str, world: int, size: dict[str, Any]) -> Any:
    request = TrainRequest(
        experiment="bench",
        steps=1000,
        device="cpu",
        model={"preset": size["preset"], "overrides": size["overrides"]},
        data={"source": "synthetic"},
        batch={"micro_batch_size": 1, "grad_accum_steps": world, "seq_len": size["seq"]},
        nproc_per_node=world,
        parallelism={"strategy": strategy},
    )
    return resolve_train(request, cuda_available=False, data_roots=[])


def local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def state_bytes(parts: TrainParts) -> int:
    """Parameters, as many gradient bytes, and every optimizer's state, as this rank holds
    them."""
    params = sum(local_bytes(p) for p in parts.model.parameters())
    optimizer = sum(
        local_bytes(v)
        for o in parts.optimizers.values()
        for state in o.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )
    return 2 * params + optimizer


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def build(strategy: str, rank: int, world: int, size: dict[str, Any]) -> tuple[TrainParts, Any]:
    plan = plan_for(strategy, world, size)
    sampler, val = build_data(plan)
    parts = build_training(
        plan, sampler, val, total_steps=plan.steps, ranks=Ranks(world, plan.parallelism)
    )
    parts.sampler = RankSampler(parts.sampler, rank, world)
    return parts, data_loader(parts, 0)


def timed(step: Callable[[], Any]) -> float:
    dist.barrier()
    started = time.perf_counter()
    step()
    dist.barrier()
    return time.perf_counter() - started


def rank_main(
    rank: int, world: int, strategies: tuple[str, ...], size: dict[str, Any], folder: Path
) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group(
        "gloo", init_method=f"file://{folder / 'store'}", rank=rank, world_size=world
    )
    before = rss_bytes()
    built = {s: build(s, rank, world, size) for s in strategies}
    steps = {s: functools.partial(train_step, p, loader, 0) for s, (p, loader) in built.items()}
    times = alternate(
        {s: functools.partial(timed, f) for s, f in steps.items()}, size["rounds"], warmup=True
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    mine = {
        "times": times,
        "state": {s: state_bytes(p) for s, (p, _) in built.items()},
        "peak_above_start": peak - before,
    }
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    for _, loader in built.values():
        loader.close()
    if rank == 0:
        torch.save(everyone, folder / "out.pt")
    dist.destroy_process_group()


def launch(world: int, strategies: tuple[str, ...], size: dict[str, Any]) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            rank_main, args=(world, strategies, size, Path(tmp)), nprocs=world, start_method="spawn"
        )
        out: list[dict[str, Any]] = torch.load(Path(tmp) / "out.pt")
    return out


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    figures: list[Figure] = []
    shape = ", ".join(f"{k}={v}" for k, v in size["overrides"].items()) or "as is"
    note = f"`{size['preset']}` ({shape}), T={size['seq']}, fp32, gloo"
    for world in size["worlds"]:
        held = {s: launch(world, (s,), size) for s in STRATEGIES}  # one launch each: its RSS
        state = {s: max(r["state"][s] for r in held[s]) for s in STRATEGIES}
        peak = {s: max(r["peak_above_start"] for r in held[s]) for s in STRATEGIES}
        figures += [
            Figure(
                f"fsdp vs ddp: W={world} state/rank, ddp", state["ddp"] / 2**20, "MiB", note=note
            ),
            Figure(f"fsdp vs ddp: W={world} state/rank, fsdp", state["fsdp"] / 2**20, "MiB"),
            Figure(
                f"fsdp vs ddp: W={world} state/rank, fsdp / ddp",
                state["fsdp"] / state["ddp"],
                "x",
                note=f"1/W = {1 / world:.3f}",
                lower_is_better=True,
            ),
            Figure(f"fsdp vs ddp: W={world} peak RSS/rank, ddp", peak["ddp"] / 2**20, "MiB"),
            Figure(f"fsdp vs ddp: W={world} peak RSS/rank, fsdp", peak["fsdp"] / 2**20, "MiB"),
            Figure(
                f"fsdp vs ddp: W={world} peak RSS/rank, fsdp / ddp",
                peak["fsdp"] / peak["ddp"],
                "x",
                lower_is_better=True,
            ),
        ]
    both = launch(2, STRATEGIES, size)  # the two in the same ranks: alternated steps
    times = both[0]["times"]
    note = f"{size['rounds']} alternated rounds"
    figures += step_time_figures("fsdp vs ddp: W=2", times, "fsdp", "ddp", note)
    return figures

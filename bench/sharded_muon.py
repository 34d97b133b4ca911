"""Issue 25, Muon on shards: a step of `ShardedMuon` (worker/training/sharded_muon.py) against
`torch.optim.Muon` on the same FSDP2 parameters, 2 gloo ranks on the CPU: step time as a paired
ratio over alternated rounds, and the collectives each issues per step (CommDebugMode).

The parameters are the hidden matrices of `blocks` transformer-like blocks of width `width`
(q, k, v, o of width x width, an MLP up and down of 4 x width), each block wrapped with
`fully_shard`. Both optimizers step on the same gradients (set once, kept); only the
step is timed, between two barriers, so a side's time is its slowest rank's.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

from bench.common import Figure, alternate, step_time_figures
from trainctl.store.training.optim import MuonSettings
from trainctl.worker.training.optim import muon_settings
from trainctl.worker.training.sharded_muon import ShardedMuon

FULL: dict[str, Any] = dict(width=256, blocks=4, rounds=7)
QUICK: dict[str, Any] = dict(width=32, blocks=1, rounds=1)
WORLD = 2


def block(width: int) -> nn.Module:
    shapes = [(width, width)] * 4 + [(4 * width, width), (width, 4 * width)]
    return nn.ParameterList([nn.Parameter(torch.randn(r, c) / c**0.5) for r, c in shapes])


def timed(optimizer: torch.optim.Optimizer) -> float:
    """One step, between barriers: the slowest rank's time."""
    dist.barrier()
    started = time.perf_counter()
    optimizer.step()
    dist.barrier()
    return time.perf_counter() - started


def rank_main(rank: int, size: dict[str, Any], folder: Path) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // WORLD))
    dist.init_process_group(
        "gloo", init_method=f"file://{folder / 'store'}", rank=rank, world_size=WORLD
    )
    mesh = init_device_mesh("cpu", (WORLD,))
    torch.manual_seed(0)
    model = nn.ModuleList([block(size["width"]) for _ in range(size["blocks"])])
    for b in model:
        fully_shard(b, mesh=mesh)
    params = list(model.parameters())
    g = torch.Generator().manual_seed(1)  # the same gradient on every rank, then sharded
    for p in params:
        p.grad = distribute_tensor(torch.randn(p.shape, generator=g), mesh, [Shard(0)])
    settings = muon_settings(MuonSettings())
    sides = {
        "sharded": ShardedMuon(params, **settings),
        "torch": torch.optim.Muon(params, **settings),
    }

    times = alternate(
        {n: functools.partial(timed, o) for n, o in sides.items()}, size["rounds"], warmup=True
    )
    counts = {}
    for name, optimizer in sides.items():
        with CommDebugMode() as comm:
            optimizer.step()
        counts[name] = comm.get_total_counts()
    if rank == 0:
        torch.save({"times": times, "counts": counts, "matrices": len(params)}, folder / "out.pt")
    dist.destroy_process_group()


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(rank_main, args=(size, Path(tmp)), nprocs=WORLD, start_method="spawn")
        out = torch.load(Path(tmp) / "out.pt")
    times, counts = out["times"], out["counts"]
    note = (
        f"{out['matrices']} matrices of width {size['width']}, {WORLD} gloo ranks, "
        f"{size['rounds']} alternated rounds"
    )
    named = {"ShardedMuon": times["sharded"], "torch.optim.Muon": times["torch"]}
    return [
        *step_time_figures("sharded muon", named, "ShardedMuon", "torch.optim.Muon", note),
        Figure("sharded muon: collectives/step, ShardedMuon", counts["sharded"], "calls"),
        Figure("sharded muon: collectives/step, torch.optim.Muon", counts["torch"], "calls"),
    ]

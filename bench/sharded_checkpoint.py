"""Sharded checkpoints (issue 25): on 2 gloo ranks over one FSDP2 model, the sharded save
(every rank writes its shards in parallel, rank 0 commits) against today's gathered save
(the full state gathered to rank 0, which writes it by `write_checkpoint`); and the training
stall of an asynchronous sharded save (`dcp.async_save` on its own gloo group) as a fraction
of a synchronous one, with the copy to CPU made before `save` returns (blocking staging) or
behind a forward and backward pass (background staging).

The ranks are spawned processes on this machine's CPUs, with each side warmed up once and
then run in alternated rounds; rank 0 reports medians. The async stall is the time the loop
is held: `save`, plus `wait_staged` after a forward and backward pass (staging into CPU
buffers kept from save to save); the write runs after it, on other threads.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, cast

from bench.common import Figure, alternate, free_port, median, paired_ratio

# `small` with 4 layers: 62 M parameters, about 0.75 GB of weights and optimizer state.
FULL: dict[str, Any] = dict(preset="small", n_layers=4, rounds=5)
QUICK: dict[str, Any] = dict(preset="small", n_layers=1, rounds=2)
WORLD = 2


def rank_main(rank: int, port: int, size: dict[str, Any], root: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    from trainctl.store.checkpoints.posix import PosixStorage
    from trainctl.store.checkpoints.store import CheckpointStore
    from trainctl.worker.checkpoints.async_sharded import AsyncShardedCheckpointer
    from trainctl.worker.checkpoints.sharded import capture_sharded, write_sharded
    from trainctl.worker.checkpoints.state import CheckpointState, write_checkpoint
    from trainctl.worker.checkpoints.training_state import (
        Progress,
        TrainingState,
        checkpoint_metadata,
    )
    from trainctl.worker.models.gpt import build_model
    from trainctl.worker.training.optim import build_optimizers

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
        timeout=timedelta(minutes=10),
    )  # fmt: skip
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // WORLD))
    model = build_model(size["preset"], seed=0, n_layers=size["n_layers"])
    mesh = init_device_mesh("cpu", (WORLD,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    register_fsdp_forward_method(model, "loss")
    optimizers = build_optimizers(model)
    x = torch.randint(0, model.config.vocab_size, (1, 16))
    model.loss(x, x)[0].backward()  # one step, so the optimizers hold their state
    optimizers.step()
    storage = PosixStorage(Path(root))
    store = CheckpointStore(storage)
    steps = iter(range(1, 10_000))
    checkpointers = {s: AsyncShardedCheckpointer(s) for s in ("blocking", "background")}

    def timed(save: Any) -> float:
        step = next(steps)
        dist.barrier()
        started = time.perf_counter()
        save(step)
        dist.barrier()
        elapsed = time.perf_counter() - started
        if rank == 0:
            shutil.rmtree(storage.path_of("bench", f"step_{step}"))
        return elapsed

    def sharded(step: int) -> None:
        state = capture_sharded(TrainingState(model, optimizers, None, "bench", Progress(step)))
        write_sharded(state, store, max_keep=None)

    def gathered(step: int) -> None:
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(model, options=full)
        optimizer = {
            n: get_optimizer_state_dict(model, o, options=full) for n, o in optimizers.items()
        }
        if rank == 0:
            training = TrainingState(model, optimizers, None, "bench", Progress(step))
            meta = checkpoint_metadata(training, f"step_{step}")
            write_checkpoint(
                CheckpointState("bench", f"step_{step}", cast(Any, weights), optimizer, meta),
                store,
                None,
            )

    def stall(staging: str) -> float:
        """How long the loop is held: `save`, then (after a forward and backward, which
        need not wait) `wait_staged` before the optimizer step."""
        checkpointer, step = checkpointers[staging], next(steps)
        state = capture_sharded(TrainingState(model, optimizers, None, "bench", Progress(step)))
        dist.barrier()
        started = time.perf_counter()
        checkpointer.save(state, store, max_keep=None)
        held = time.perf_counter() - started
        model.loss(x, x)[0].backward()
        started = time.perf_counter()
        checkpointer.wait_staged()
        held += time.perf_counter() - started
        optimizers.zero_grad()
        checkpointer.wait()
        dist.barrier()
        if rank == 0:
            shutil.rmtree(storage.path_of("bench", f"step_{step}"))
        return held

    times = alternate(
        {"sharded": lambda: timed(sharded), "gathered": lambda: timed(gathered)},
        size["rounds"],
        warmup=True,
    )
    first = stall("blocking")
    stall("background")  # its first save allocates its buffers too
    sides: dict[str, Callable[[], float]] = {s: partial(stall, s) for s in checkpointers}
    stalls = alternate(sides, size["rounds"])
    if rank == 0:
        total = sum(p.numel() * p.element_size() for p in model.parameters())  # global
        Path(out).write_text(json.dumps({**times, **stalls, "first": first, "bytes": total}))
    dist.barrier()
    dist.destroy_process_group()


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(dir=os.environ.get("TRAINCTL_BENCH_TMP")) as tmp:
        out, port = Path(tmp) / "figures.json", free_port()
        ranks = [
            context.Process(
                target=rank_main, args=(r, port, size, str(Path(tmp) / "store"), str(out))
            )
            for r in range(WORLD)
        ]
        for p in ranks:
            p.start()
        for p in ranks:
            p.join()
        if any(p.exitcode != 0 for p in ranks):
            raise RuntimeError(f"a bench rank failed: exit codes {[p.exitcode for p in ranks]}")
        found = json.loads(out.read_text())
    sync = median(found["sharded"])
    note = (
        f"{size['preset']} x{size['n_layers']} layers, {found['bytes'] / 1e6:,.0f} MB of weights "
        f"(x3 with AdamW/Muon state), {WORLD} gloo ranks on CPU, {size['rounds']} rounds"
    )
    return [
        Figure("sharded checkpoint: sharded save time (2 ranks)", sync, "s", note=note),
        Figure("sharded checkpoint: gathered rank-0 save time", median(found["gathered"]), "s"),
        Figure(
            "sharded checkpoint: gathered / sharded save time",
            paired_ratio(found["gathered"], found["sharded"]),
            "x",
            note="above 1: the sharded save is faster",
        ),
        Figure(
            "sharded checkpoint: async stall per save (steady state)",
            median(found["blocking"]),
            "s",
            note=f"first save, which allocates the CPU buffers: {found['first']:.3f} s",
        ),
        Figure(
            "sharded checkpoint: async stall / sync sharded save",
            median(found["blocking"]) / sync,
            "x",
            target=0.10,
            lower_is_better=True,
            note="staging blocking: the copy to CPU is the stall",
        ),
        Figure(
            "sharded checkpoint: async stall, background staging / sync",
            median(found["background"]) / sync,
            "x",
            target=0.10,
            lower_is_better=True,
            note="the copy runs during a forward and backward; wait_staged before the step",
        ),
    ]

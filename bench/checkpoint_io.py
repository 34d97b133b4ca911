"""Item 4: checkpoint writes. A synchronous trainctl save (staging folder, fsync, sha256
manifest, atomic rename) against a raw `safetensors.save_file` + `torch.save` of the same
tensors; and the training stall of an asynchronous save against a synchronous one.

Disk and page-cache timings on a shared VM swing by 3x from one save to the next, so each
side is warmed up once and the ratio is the median of 7 alternated pairs.

The model trains on CUDA where there is one (else the CPU), so that the async stall includes
the device-to-host copy it exists to hide; there the stall is timed up to the end of the
copies on the GPU, not only until `save` returns (it returns once they are queued)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from bench.common import Figure, alternate, median, paired_ratio
from trainctl.store.checkpoints.posix import PosixStorage
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.worker.checkpoints.async_save import AsyncCheckpointer
from trainctl.worker.checkpoints.state import CheckpointState, capture_checkpoint, write_checkpoint
from trainctl.worker.checkpoints.training_state import Progress, TrainingState
from trainctl.worker.models.gpt import build_model
from trainctl.worker.training.optim import build_optimizers

# `small` with 4 layers: 62 M parameters, about 0.75 GB of weights and optimizer state.
FULL: dict[str, Any] = dict(preset="small", n_layers=4, rounds=7)
QUICK: dict[str, Any] = dict(preset="small", n_layers=1, rounds=2)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def trained_state(size: dict[str, Any]) -> tuple[Any, ...]:
    model = build_model(size["preset"], device=DEVICE, seed=0, n_layers=size["n_layers"])
    optimizers = build_optimizers(model)
    x = torch.randint(0, model.config.vocab_size, (1, 16), device=DEVICE)
    model.loss(x, x)[0].backward()  # one step, so the optimizers hold their state
    optimizers.step()
    return model, optimizers


def nbytes(state: CheckpointState) -> int:
    def size(obj: Any) -> int:
        if isinstance(obj, torch.Tensor):
            return obj.numel() * obj.element_size()
        if isinstance(obj, dict):
            return sum(size(v) for v in obj.values())
        if isinstance(obj, list | tuple):
            return sum(size(v) for v in obj)
        return 0

    return size(state.model) + size(state.optimizer)


def raw_save(state: CheckpointState, folder: Path, fsync: bool) -> float:
    folder.mkdir(parents=True)
    started = time.perf_counter()
    save_file(state.host_weights(), str(folder / "model.safetensors"))
    torch.save(state.optimizer, folder / "optimizer.pt")
    if fsync:
        for name in ("model.safetensors", "optimizer.pt"):
            fd = os.open(folder / name, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    elapsed = time.perf_counter() - started
    shutil.rmtree(folder)
    return elapsed


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    model, optimizers = trained_state(size)
    step = iter(range(1, 10_000))

    def capture(dtype: torch.dtype | None = None) -> CheckpointState:
        state = TrainingState(model, optimizers, None, "bench", Progress(next(step)))
        return capture_checkpoint(state, dtype=dtype)

    total = nbytes(capture())
    with tempfile.TemporaryDirectory(dir=os.environ.get("TRAINCTL_BENCH_TMP")) as tmp:
        root = Path(tmp)
        storage = PosixStorage(root / "store")
        store = CheckpointStore(storage)

        def ours() -> float:
            # Like raw_save: the state is captured before and the files deleted after the
            # clock, so retention's deletes of older checkpoints are not counted either.
            state = capture()
            started = time.perf_counter()
            write_checkpoint(state, store, max_keep=None)
            elapsed = time.perf_counter() - started
            shutil.rmtree(storage.path_of(state.experiment, state.tag))
            return total / elapsed

        sides = {
            "trainctl": ours,
            "raw": lambda: total / raw_save(capture(), root / "raw", fsync=False),
            "raw+fsync": lambda: total / raw_save(capture(), root / "raw", fsync=True),
        }
        rates = alternate(sides, size["rounds"], warmup=True)
        sync_times = [total / r for r in rates["trainctl"]]
        stalls, first = async_stalls(capture, store, size["rounds"])
        bf16_stalls, _ = async_stalls(lambda: capture(torch.bfloat16), store, size["rounds"])
    mb = total / 1e6
    note = (
        f"{mb:,.0f} MB of weights + optimizer state, {size['rounds']} alternated rounds, "
        f"on {DEVICE}"
    )
    return [
        Figure(
            "checkpoint: trainctl sync save MB/s",
            median(rates["trainctl"]) / 1e6,
            "MB/s",
            note=note,
        ),
        Figure("checkpoint: raw save_file + torch.save MB/s", median(rates["raw"]) / 1e6, "MB/s"),
        Figure("checkpoint: raw + fsync MB/s", median(rates["raw+fsync"]) / 1e6, "MB/s"),
        Figure(
            "checkpoint: trainctl sync / raw",
            paired_ratio(rates["trainctl"], rates["raw"]),
            "x",
            target=0.7,
        ),
        Figure(
            "checkpoint: trainctl sync / raw + fsync",
            paired_ratio(rates["trainctl"], rates["raw+fsync"]),
            "x",
        ),
        Figure("checkpoint: sync save time", median(sync_times), "s"),
        Figure(
            "checkpoint: async stall per save (steady state)",
            median(stalls),
            "s",
            note=f"first save, which allocates the CPU buffers: {first:.3f} s",
        ),
        Figure(
            "checkpoint: async stall per save, bf16 weights",
            median(bf16_stalls),
            "s",
            note="save_dtype bfloat16: the weights are cast as they are staged",
        ),
        Figure(
            "checkpoint: async stall / sync save",
            median(stalls) / median(sync_times),
            "x",
            target=0.10,
            lower_is_better=True,
        ),
    ]


def async_stalls(capture: Any, store: CheckpointStore, rounds: int) -> tuple[list[float], float]:
    """Time the loop waits in `save` (capture and copy), the previous save already finished.

    On a GPU, up to the end of the copies there: the next step's kernels queue behind them.
    """
    saver = AsyncCheckpointer()
    stalls = []
    for _ in range(rounds + 1):
        saver.wait()
        maybe_synchronize()
        started = time.perf_counter()
        saver.save(capture(), lambda s: write_checkpoint(s, store, max_keep=1), {})
        maybe_synchronize()
        stalls.append(time.perf_counter() - started)
    saver.wait()
    return stalls[1:], stalls[0]


def maybe_synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()

"""Issue 24, first measurement: trainctl's train loop (`worker.training.loop.train`) training a
transformers llama config, against a plain PyTorch loop over the same transformers model
(built by the same `build_training`), the same optimizers (Muon + AdamW as trainctl builds
them), the same schedule and the same batches from the same loader, on CPU.

What the loop adds is what is measured: metrics, validation bookkeeping, the step's
accounting. Neither side validates or saves inside the timed steps (val_every and
checkpoint_every past the end). Each side's figure is the median step's tokens/s after the
first WARMUP steps; rounds alternate the sides.

The third side is issue 24's third measurement: a benchmark run of the same model and batch
geometry (`worker.kinds.benchmark.run_benchmark`, synthetic tokens) runs the same step code as a
train run, so its tokens/s should equal trainctl's train loop's within noise.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import Figure, alternate, median, paired_ratio
from trainctl.store.checkpoints.posix import PosixStorage
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.kinds.benchmark import BenchmarkRequest, resolve_benchmark
from trainctl.store.kinds.train import TrainRequest, resolve_train
from trainctl.worker.kinds.benchmark import run_benchmark
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import build_data, build_training, data_loader, train

# A llama of width 256, 4 layers, byte-level: a step of about a second on two cores; 16 steps
# and 7 rounds a side, since 8 and 5 were noise-bound (docs/performance.md, item 11a).
FULL: dict[str, Any] = dict(width=256, layers=4, batch=8, seq=128, steps=16, rounds=7)
QUICK: dict[str, Any] = dict(width=64, layers=1, batch=2, seq=32, steps=6, rounds=1)
WARMUP = 2
"""Steps left out of each side's median: the first ones wait for the loader and allocate."""


def hf_config(size: dict[str, Any]) -> dict[str, Any]:
    w = size["width"]
    return {
        "model_type": "llama", "vocab_size": 256, "hidden_size": w,
        "intermediate_size": 3 * w, "num_hidden_layers": size["layers"],
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
    }  # fmt: skip


def batch(size: dict[str, Any]) -> dict[str, int]:
    return {"micro_batch_size": size["batch"], "seq_len": size["seq"], "grad_accum_steps": 1}


def request(size: dict[str, Any]) -> TrainRequest:
    steps = size["steps"]
    return TrainRequest(
        experiment="hf-train", steps=steps, model={"hf": hf_config(size)}, device="cpu",
        batch=batch(size),
        data={"max_bytes": 1_000_000}, checkpoint_every=steps, val_every=steps,
        val_batches=1, log_every=1,
    )  # fmt: skip


def trainctl_side(size: dict[str, Any]) -> float:
    """tokens/s of trainctl's own loop: the median of its per-step metrics after the first."""
    plan = resolve_train(request(size), cuda_available=False, data_roots=[], checkpoints=None)
    seen: list[float] = []

    def on_metrics(m: dict[str, Any]) -> None:
        if m["kind"] == "train" and m["step"] > WARMUP:
            seen.append(m["tokens_per_sec"])

    with tempfile.TemporaryDirectory() as root:
        train(
            plan,
            CheckpointStore(PosixStorage(Path(root))),
            hooks=TrainerHooks(on_metrics=on_metrics),
        )
    return median(seen)


def benchmark_side(size: dict[str, Any]) -> float:
    """tokens/s of a benchmark run of the same model: the median of its measured steps."""
    req = BenchmarkRequest(
        model={"hf": hf_config(size)}, batch=batch(size), device="cpu",
        warmup_steps=WARMUP, steps=size["steps"] - WARMUP,
    )  # fmt: skip
    plan = resolve_benchmark(req, cuda_available=False)
    seen: list[float] = []
    run_benchmark(
        plan, on_step=lambda m: seen.append(m["tokens_per_sec"]) if m["kind"] == "measure" else None
    )
    return median(seen)


def plain_side(size: dict[str, Any]) -> float:
    """tokens/s of a plain loop over the same built parts: forward, backward, clip, step."""
    plan = resolve_train(request(size), cuda_available=False, data_roots=[], checkpoints=None)
    sampler, val = build_data(plan)
    parts = build_training(plan, sampler, val, total_steps=plan.steps)
    loader = data_loader(parts, 0)
    model, optimizers = parts.model, parts.optimizers
    times = []
    try:
        for _ in range(plan.steps):
            started = time.perf_counter()
            tokens, targets = next(loader)
            loss, _ = model.loss(tokens, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), parts.grad_clip)
            optimizers.step()
            optimizers.zero_grad(set_to_none=True)
            parts.scheduler.step()
            loss.item()
            times.append(time.perf_counter() - started)
    finally:
        loader.close()
    return size["batch"] * size["seq"] / median(times[WARMUP:])


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    tps = alternate(
        {
            "trainctl": lambda: trainctl_side(size),
            "plain": lambda: plain_side(size),
            "benchmark": lambda: benchmark_side(size),
        },
        size["rounds"],
    )
    note = (
        f"llama d{size['width']}x{size['layers']}, B={size['batch']} T={size['seq']}, "
        f"Muon+AdamW, {torch.get_num_threads()} threads, {size['rounds']} alternated rounds"
    )
    return [
        Figure("hf train: trainctl loop tokens/s", median(tps["trainctl"]), "tok/s", note=note),
        Figure("hf train: plain loop tokens/s", median(tps["plain"]), "tok/s"),
        Figure(
            "hf train: trainctl loop / plain loop",
            paired_ratio(tps["trainctl"], tps["plain"]),
            "x",
            target=0.97,
        ),
        Figure("hf train: benchmark run tokens/s", median(tps["benchmark"]), "tok/s"),
        Figure(
            "hf train: benchmark run / trainctl loop",
            paired_ratio(tps["benchmark"], tps["trainctl"]),
            "x",
            note="the same step code: 1 within noise",
        ),
    ]

"""Item 5: what the async loader delivers against what a training step consumes on `small`,
and the data-wait fraction a real train run reports."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import Figure
from trainctl.store.checkpoints.posix import PosixStorage
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.kinds.train import TrainRequest, resolve_train
from trainctl.store.specs import DataSpec
from trainctl.worker.data.loader import AsyncDataLoader, TokenSampler
from trainctl.worker.models.gpt import build_model
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import build_token_arrays, train
from trainctl.worker.training.optim import build_optimizers

# The loader at the CUDA train profile's geometry (small: B=16, T=1024); the step on `small`
# (all 12 layers; 1 in --quick) at a CPU-sized batch.
FULL: dict[str, Any] = dict(
    loader_batches=200, B=16, T=1024, step_B=1, step_T=256, steps=2, run_steps=6, layers=12
)
QUICK: dict[str, Any] = dict(
    loader_batches=20, B=16, T=1024, step_B=1, step_T=64, steps=1, run_steps=3, layers=1
)
MAX_BYTES = 16_000_000


def loader_rate(size: dict[str, Any]) -> float:
    train_arrays, _ = build_token_arrays(DataSpec(max_bytes=MAX_BYTES))
    sampler = TokenSampler(train_arrays, size["B"], size["T"], seed=0)
    with AsyncDataLoader(sampler.iterate(), "cpu", prefetch_factor=4) as loader:
        next(loader)
        return float(loader.benchmark(size["loader_batches"])["tokens_per_sec"])


def step_rate(size: dict[str, Any]) -> float:
    model = build_model("small", seed=0, n_layers=size["layers"])
    optimizers = build_optimizers(model)
    x = torch.randint(0, 256, (size["step_B"], size["step_T"]))

    def step() -> None:
        model.loss(x, x)[0].backward()
        optimizers.step()
        optimizers.zero_grad(set_to_none=True)

    step()
    started = time.perf_counter()
    for _ in range(size["steps"]):
        step()
    return x.numel() * size["steps"] / (time.perf_counter() - started)


def run_wait_fraction(size: dict[str, Any]) -> tuple[float, float]:
    """(mean per-step data_wait_frac, the run's) of a real train run of `small` on stdlib."""
    plan = resolve_train(
        TrainRequest(
            steps=size["run_steps"],
            log_every=1,
            model={"preset": "small", "overrides": {"n_layers": size["layers"]}},
            batch={"micro_batch_size": size["step_B"], "seq_len": size["step_T"]},
            checkpoint_every=10_000,
            data={"max_bytes": MAX_BYTES},
            val_batches=1,
        ),
        cuda_available=False,
        data_roots=[],
    )
    fracs: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        result = train(
            plan,
            CheckpointStore(PosixStorage(Path(tmp))),
            hooks=TrainerHooks(
                on_metrics=lambda m: (
                    fracs.append(m["data_wait_frac"]) if m["kind"] == "train" else None
                )
            ),
        )
    # The first step waits for the producer's first batch (and the corpus to be read).
    steady = fracs[1:] or fracs
    return sum(steady) / len(steady), float(result["data_wait_frac"])


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    delivered, consumed = loader_rate(size), step_rate(size)
    step_frac, run_frac = run_wait_fraction(size)
    return [
        Figure("data: async loader tokens/s (stdlib bytes, B=16 T=1024)", delivered, "tok/s"),
        Figure("data: small train step tokens/s (CPU)", consumed, "tok/s"),
        Figure("data: loader / train step", delivered / consumed, "x", target=20),
        Figure(
            "data: data_wait_frac per step (small, after step 1)",
            step_frac,
            "frac",
            target=0.02,
            lower_is_better=True,
        ),
        Figure("data: data_wait_frac of the whole run (incl. validation, saves)", run_frac, "frac"),
    ]

"""Item 3: wall time to a fixed validation loss on the byte-level stdlib corpus.

trainctl: its model, Muon + AdamW, the WSD schedule. The peer: LlamaForCausalLM of the same
dimensions, AdamW, linear warm-up then cosine to 10 % (what a plain HF loop uses). Each side
gets a small lr sweep and the same step budget, batches and validation windows. The clock
counts training steps only (validation is excluded for both).

The fixed loss is the higher of the two sides' best final validation losses, so that both
reach it; a side's time is the earliest validation at or below it across its sweep.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.common import Figure
from bench.hf_peer import build_adamw, build_llama, llama_loss
from trainctl.store.models.presets import ModelConfig
from trainctl.store.specs import DataSpec
from trainctl.store.training.optim import OptimizerSpec
from trainctl.worker.data.loader import TokenSampler
from trainctl.worker.models.gpt import build_model
from trainctl.worker.training.loop import build_token_arrays
from trainctl.worker.training.optim import build_optimizers
from trainctl.worker.training.schedule import build_scheduler

CONFIG = ModelConfig(
    vocab_size=256, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=384,
    max_seq_len=128,
)  # fmt: skip
FULL: dict[str, Any] = dict(steps=300, eval_every=25, B=16, T=128, val_batches=4,
            muon_lrs=[0.01, 0.02, 0.04], adamw_lr=3e-3,
            peer_lrs=[3e-4, 1e-3, 3e-3, 1e-2])  # fmt: skip
QUICK: dict[str, Any] = dict(steps=30, eval_every=10, B=8, T=64, val_batches=2,
             muon_lrs=[0.02], adamw_lr=3e-3, peer_lrs=[3e-3])  # fmt: skip
WARMUP_FRAC = 0.01
Curve = list[tuple[float, int, float]]  # (training seconds, step, validation loss)


def cosine(steps: int) -> Callable[[int], float]:
    warmup = max(1, int(WARMUP_FRAC * steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def train_curve(
    model: torch.nn.Module,
    loss_fn: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor],
    optimizers: list[torch.optim.Optimizer],
    schedule_step: Callable[[], None],
    size: dict[str, Any],
    sampler: TokenSampler,
    val: list[tuple[torch.Tensor, torch.Tensor]],
) -> Curve:
    curve: Curve = []
    clock = 0.0
    for step in range(1, size["steps"] + 1):
        tokens, targets = sampler.batch(step)
        started = time.perf_counter()
        loss_fn(model, tokens, targets).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        schedule_step()
        clock += time.perf_counter() - started
        if step % size["eval_every"] == 0 or step == size["steps"]:
            model.eval()
            with torch.no_grad():
                v = sum(float(loss_fn(model, x, y)) for x, y in val) / len(val)
            model.train()
            curve.append((clock, step, v))
    return curve


def trainctl_loss(model: Any, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return model.loss(tokens, targets)[0]


def run_trainctl(muon_lr: float, size: dict[str, Any], data: Any) -> Curve:
    model = build_model(CONFIG, seed=0)
    optimizers = build_optimizers(model, OptimizerSpec(muon_lr=muon_lr, adamw_lr=size["adamw_lr"]))
    sched = build_scheduler(optimizers, size["steps"], WARMUP_FRAC)
    return train_curve(model, trainctl_loss, list(optimizers.values()), sched.step, size, *data)


def run_peer(lr: float, size: dict[str, Any], data: Any) -> Curve:
    model = build_llama(CONFIG, size["T"], seed=0)
    opt = build_adamw(model, lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine(size["steps"]))
    return train_curve(model, llama_loss, [opt], sched.step, size, *data)


def time_to(curves: dict[str, Curve], target: float) -> tuple[float, str]:
    hits = [(next((t for t, _, v in c if v <= target), math.inf), k) for k, c in curves.items()]
    return min(hits)


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    train_arrays, val_arrays = build_token_arrays(DataSpec(max_bytes=4_000_000))
    sampler = TokenSampler(train_arrays, size["B"], size["T"], seed=0)
    val_sampler = TokenSampler(val_arrays, size["B"], size["T"], seed=1)
    data = (sampler, [val_sampler.batch(i) for i in range(size["val_batches"])])
    ours = {f"muon_lr={lr}": run_trainctl(lr, size, data) for lr in size["muon_lrs"]}
    peer = {f"adamw_lr={lr}": run_peer(lr, size, data) for lr in size["peer_lrs"]}
    best_ours = min(c[-1][2] for c in ours.values())
    best_peer = min(c[-1][2] for c in peer.values())
    target = max(best_ours, best_peer)
    t_ours, k_ours = time_to(ours, target)
    t_peer, k_peer = time_to(peer, target)
    sweep = "; ".join(
        f"{side} {k}: final {c[-1][2]:.3f}"
        for side, runs in (("trainctl", ours), ("peer", peer))
        for k, c in runs.items()
    )
    return [
        Figure(
            "time to quality: target validation loss",
            target,
            "nats",
            note=f"{size['steps']} steps of B={size['B']} T={size['T']}; {sweep}",
        ),
        Figure("time to quality: trainctl (Muon+AdamW, WSD)", t_ours, "s", note=k_ours),
        Figure("time to quality: HF Llama (AdamW, cosine)", t_peer, "s", note=k_peer),
        Figure("time to quality: peer time / trainctl time", t_peer / t_ours, "x", target=1.3),
    ]

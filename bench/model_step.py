"""Item 2: trainctl's model against HF LlamaForCausalLM of the same dimensions, on CPU.

Every side trains on the same random batches, fp32, with the same intra-op thread count, in
one process, alternated round by round. Sides:
  peer           LlamaForCausalLM + torch.optim.AdamW as a plain loop builds it
  model-only     trainctl's GPT + that same plain AdamW (isolates the model)
  trainctl       trainctl's GPT + trainctl's AdamW (optimizer kind adamw: fused)
  muon           trainctl's GPT + Muon + AdamW (optimizer kind muon_adamw, the default)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from bench.common import Figure, alternate, median, paired_ratio
from bench.hf_peer import build_adamw, build_llama, llama_loss
from trainctl.store.models.presets import ModelConfig, get_preset
from trainctl.store.training.optim import OptimizerSpec
from trainctl.worker.models.gpt import build_model
from trainctl.worker.training.optim import build_optimizers

# `small`'s widths, vocab and heads, with 4 of its 12 layers so a step takes seconds on two
# cores; the vocab (64,000) stays, since the head is where the two models differ most.
FULL: dict[str, Any] = dict(preset="small", n_layers=4, batch=2, seq=256, steps=3, rounds=3)
QUICK: dict[str, Any] = dict(preset="small", n_layers=1, batch=1, seq=64, steps=1, rounds=2)


def config(size: dict[str, Any]) -> ModelConfig:
    return get_preset(size["preset"]).replace(n_layers=size["n_layers"])


def stepper(
    model: torch.nn.Module,
    loss_fn: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor],
    optimizers: list[torch.optim.Optimizer],
    batches: list[tuple[torch.Tensor, torch.Tensor]],
) -> Callable[[], float]:
    """A side: runs one optimizer step per batch and returns tokens per wall second."""

    def run() -> float:
        started = time.perf_counter()
        for tokens, targets in batches:
            loss = loss_fn(model, tokens, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
            loss.item()
        return sum(t.numel() for t, _ in batches) / (time.perf_counter() - started)

    return run


def trainctl_loss(model: Any, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return model.loss(tokens, targets)[0]


def sides(size: dict[str, Any]) -> dict[str, Callable[[], float]]:
    cfg = config(size)
    g = torch.Generator().manual_seed(0)
    batches = [
        (
            torch.randint(0, cfg.vocab_size, (size["batch"], size["seq"]), generator=g),
            torch.randint(0, cfg.vocab_size, (size["batch"], size["seq"]), generator=g),
        )
        for _ in range(size["steps"])
    ]
    peer = build_llama(cfg, size["seq"])
    ours = [build_model(cfg, seed=0) for _ in range(3)]
    adamw = build_optimizers(ours[1], OptimizerSpec(kind="adamw"))
    muon = build_optimizers(ours[2])
    return {
        "peer": stepper(peer, llama_loss, [build_adamw(peer)], batches),
        "model-only": stepper(ours[0], trainctl_loss, [build_adamw(ours[0])], batches),
        "trainctl": stepper(ours[1], trainctl_loss, list(adamw.values()), batches),
        "muon": stepper(ours[2], trainctl_loss, list(muon.values()), batches),
    }


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    runners = sides(size)
    for fn in runners.values():  # warm-up: allocator growth, first-call dispatch
        fn()
    tps = alternate(runners, size["rounds"])
    dims = (
        f"{size['preset']} dims, {size['n_layers']} layers, B={size['batch']} "
        f"T={size['seq']}, fp32, {torch.get_num_threads()} threads, "
        f"{size['rounds']} alternated rounds"
    )
    figs = [
        Figure(f"model step: {n} tokens/s", median(v), "tok/s", note=dims) for n, v in tps.items()
    ]
    return [
        *figs,
        Figure(
            "model step: trainctl (AdamW) / HF Llama (AdamW)",
            paired_ratio(tps["trainctl"], tps["peer"]),
            "x",
            target=1.05,
        ),
        Figure(
            "model step: trainctl model / HF Llama, same plain AdamW",
            paired_ratio(tps["model-only"], tps["peer"]),
            "x",
        ),
        Figure(
            "model step: trainctl Muon+AdamW / HF Llama (AdamW)",
            paired_ratio(tps["muon"], tps["peer"]),
            "x",
        ),
    ]

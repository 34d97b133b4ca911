"""Issue 15: generation tokens/s on CPU, greedy, every side decoding the same prompts to
exactly `new_tokens` new tokens (no end-of-text stop), in one process with the same threads,
alternated round by round. Sides:
  cache       trainctl's decoder (worker.models.generation.generate_tokens) with the KV cache
  recompute   the same decoder recomputing the whole prefix every step: what the cache saves
  peer        transformers' `generate` (use_cache=True) on the export of the same weights
              (worker.checkpoints.exports.export_hf: Qwen3), when worker.checkpoints.exports is
              there
Tokens/s count the new tokens of every row; the prompt's prefill is inside the time.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.common import Figure, alternate, median, paired_ratio
from trainctl.store.checkpoints.factory import open_stores
from trainctl.store.layout import DataLayout
from trainctl.store.models.generation import GenerationSettings
from trainctl.store.models.presets import ModelConfig, get_preset
from trainctl.worker.checkpoints.state import capture_checkpoint, write_checkpoint
from trainctl.worker.checkpoints.training_state import Progress, TrainingState
from trainctl.worker.models.generation import generate_tokens
from trainctl.worker.models.gpt import GPT, build_model
from trainctl.worker.training.optim import build_optimizers
from trainctl.worker.training.schedule import build_scheduler

# `tiny` as it is, and a model 30 times its size with a BPE-sized vocabulary: still small
# enough that recomputing 256 positions a step at batch 8 takes a minute on two cores.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {},
    "d256x4": dict(
        d_model=256,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        ffn_hidden=768,
        vocab_size=8192,
        max_seq_len=1024,
    ),
}
FULL: dict[str, Any] = dict(sizes=["tiny", "d256x4"], batches=[1, 8], prompt=32, new=256, rounds=2)
QUICK: dict[str, Any] = dict(sizes=["tiny"], batches=[1, 8], prompt=16, new=32, rounds=1)
PEER_TARGET = 1.0


def config(size: str) -> ModelConfig:
    return get_preset("tiny").replace(**SIZES[size])


def prompt_ids(cfg: ModelConfig, batch: int, length: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, cfg.vocab_size, (batch, length), generator=g).tolist()


def trainctl_side(
    model: GPT, prompts: list[list[int]], new: int, use_cache: bool, out: list[list[int]]
) -> Callable[[], float]:
    settings = GenerationSettings(temperature=0, top_k=None, max_new_tokens=new)

    def run() -> float:
        started = time.perf_counter()
        out[:] = generate_tokens(model, prompts, settings, use_cache=use_cache)
        return len(prompts) * new / (time.perf_counter() - started)

    return run


def exported(model: GPT, root: Path) -> Any:
    """The model as transformers loads it after trainctl's export (Qwen3), or None when this
    checkout has no worker.checkpoints.exports."""
    try:
        from trainctl.worker.checkpoints.exports import export_hf
    except ImportError:
        return None
    from transformers import AutoModelForCausalLM

    optimizers = build_optimizers(model)
    scheduler = build_scheduler(optimizers, 1)
    state = capture_checkpoint(TrainingState(model, optimizers, scheduler, "bench", Progress(1)))
    stores = open_stores(DataLayout(root))
    write_checkpoint(state, stores.checkpoints)
    export_hf(stores.checkpoints.entry("bench", state.tag), stores.exports, "bench", state.tag)
    hf = stores.layout.exports / "bench" / state.tag  # transformers loads a folder
    return AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()


def peer_side(
    hf: Any, prompts: list[list[int]], new: int, out: list[list[int]]
) -> Callable[[], float]:
    from transformers import GenerationConfig

    generation = GenerationConfig(
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        use_cache=True,
        eos_token_id=None,
        pad_token_id=0,
    )
    ids = torch.tensor(prompts)

    def run() -> float:
        started = time.perf_counter()
        with torch.inference_mode():
            tokens = hf.generate(
                ids, attention_mask=torch.ones_like(ids), generation_config=generation
            )
        elapsed = time.perf_counter() - started
        out[:] = tokens[:, ids.shape[1] :].tolist()
        return len(prompts) * new / elapsed

    return run


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def same_tokens(a: list[list[int]], b: list[list[int]]) -> str:
    """How far two greedy decodes agree: random weights have near ties, where the last bits
    of two implementations' arithmetic may pick different tokens."""
    agree = sum(first_difference(r, s) for r, s in zip(a, b, strict=True))
    return f"greedy tokens agree up to the first difference: {agree}/{sum(map(len, a))}"


def measure(size: str, batch: int, p: dict[str, Any], hf: Any, model: GPT) -> list[Figure]:
    prompts = prompt_ids(model.config, batch, p["prompt"])
    outs: dict[str, list[list[int]]] = {"cache": [], "recompute": [], "peer": []}
    sides = {
        "cache": trainctl_side(model, prompts, p["new"], True, outs["cache"]),
        "recompute": trainctl_side(model, prompts, p["new"], False, outs["recompute"]),
    }
    if hf is not None:
        sides["peer"] = peer_side(hf, prompts, p["new"], outs["peer"])
    got = alternate(sides, p["rounds"])
    name = f"generate {size} b{batch} {p['new']} new tokens"
    figures = [
        Figure(f"{name}: KV cache", median(got["cache"]), "tok/s"),
        Figure(f"{name}: full recomputation", median(got["recompute"]), "tok/s"),
        Figure(
            f"{name}: KV cache speed-up over recomputation",
            paired_ratio(got["cache"], got["recompute"]),
            "x",
            note=same_tokens(outs["cache"], outs["recompute"]),
        ),
    ]
    if hf is not None:
        figures += [
            Figure(f"{name}: transformers generate", median(got["peer"]), "tok/s"),
            Figure(
                f"{name}: KV cache vs transformers generate",
                paired_ratio(got["cache"], got["peer"]),
                "x",
                target=PEER_TARGET,
                note=same_tokens(outs["cache"], outs["peer"]),
            ),
        ]
    return figures


def run(quick: bool = False) -> list[Figure]:
    p = QUICK if quick else FULL
    figures = []
    for size in p["sizes"]:
        model = build_model(config(size), seed=0).eval()
        with tempfile.TemporaryDirectory(prefix="trainctl-bench-generate-") as tmp:
            hf = exported(model, Path(tmp))
            if hf is None:
                print(
                    "generate: this checkout has no worker.checkpoints.exports; "
                    "no transformers peer"
                )
            for batch in p["batches"]:
                figures += measure(size, batch, p, hf, model)
    return figures

"""Issue 24, second measurement: what the built-in path is worth. trainctl trains its own GPT
and a transformers llama of the same shape (width, layers, heads, key/value heads, MLP width,
byte-level vocabulary) with the same recipe: Muon + AdamW as trainctl builds them, the WSD
schedule, the same batches from the same corpus, on CPU.

Two figures, both as GPT / llama: tokens/s (the median step after WARMUP) and the training
time to a fixed validation loss. The fixed loss is the higher of the two sides' best
validation losses, so that both reach it; a side's time is the sum of its step times up to
the first validation at or below it (validation itself is not counted). The models differ in
more than speed: the GPT has QK-norm and a logit soft-cap, the llama neither, so the second
figure says what the built-in model's recipe buys, not only its kernels.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.common import Figure, alternate, median, paired_ratio
from trainctl.store.checkpoints.posix import PosixStorage
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.kinds.train import TrainRequest, resolve_train
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import train

FULL: dict[str, Any] = dict(width=128, layers=4, batch=8, seq=128, steps=300, val_every=25,
            rounds=2)  # fmt: skip
QUICK: dict[str, Any] = dict(width=64, layers=1, batch=2, seq=32, steps=8, val_every=4,
             rounds=1)  # fmt: skip
WARMUP = 2
"""Steps left out of the tokens/s median: the first ones wait for the loader and allocate."""
HEADS, KV_HEADS, VOCAB = 4, 2, 256


def model(side: str, size: dict[str, Any]) -> dict[str, Any]:
    """The same shape as each side names it: a preset's overrides, or a transformers config."""
    w, layers = size["width"], size["layers"]
    if side == "gpt":
        shape = dict(vocab_size=VOCAB, d_model=w, n_layers=layers, n_heads=HEADS,
                     n_kv_heads=KV_HEADS, ffn_hidden=3 * w, max_seq_len=size["seq"])  # fmt: skip
        return {"preset": "tiny", "overrides": shape}
    hf = dict(model_type="llama", vocab_size=VOCAB, hidden_size=w, intermediate_size=3 * w,
              num_hidden_layers=layers, num_attention_heads=HEADS,
              num_key_value_heads=KV_HEADS, max_position_embeddings=size["seq"])  # fmt: skip
    return {"hf": hf}


def request(side: str, size: dict[str, Any]) -> TrainRequest:
    steps = size["steps"]
    return TrainRequest(
        experiment=f"hf-vs-gpt-{side}", steps=steps, model=model(side, size), device="cpu",
        batch={"micro_batch_size": size["batch"], "seq_len": size["seq"], "grad_accum_steps": 1},
        data={"max_bytes": 1_000_000}, checkpoint_every=steps, val_every=size["val_every"],
        val_batches=4, log_every=1,
    )  # fmt: skip


def train_side(side: str, size: dict[str, Any]) -> dict[str, Any]:
    """One run: its tokens/s, and (training seconds so far, validation loss) per validation."""
    plan = resolve_train(request(side, size), cuda_available=False, data_roots=[], checkpoints=None)
    tps: list[float] = []
    curve: list[tuple[float, float]] = []
    clock = 0.0

    def on_metrics(m: dict[str, Any]) -> None:
        nonlocal clock
        if m["kind"] == "train":
            clock += m["step_time_sec"]  # log_every=1: one step's time per event
            if m["step"] > WARMUP:
                tps.append(m["tokens_per_sec"])
        elif m["kind"] == "val":
            curve.append((clock, m["val_loss"]))

    with tempfile.TemporaryDirectory() as root:
        train(
            plan,
            CheckpointStore(PosixStorage(Path(root))),
            hooks=TrainerHooks(on_metrics=on_metrics),
        )
    return {"tps": median(tps), "curve": curve}


def time_to(curve: list[tuple[float, float]], loss: float) -> float:
    return next(seconds for seconds, val in curve if val <= loss)


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    runs: dict[str, list[dict[str, Any]]] = {"gpt": [], "llama": []}

    def side(name: str) -> Callable[[], float]:
        def once() -> float:
            runs[name].append(train_side(name, size))
            return float(runs[name][-1]["tps"])

        return once

    tps = alternate({n: side(n) for n in runs}, size["rounds"])
    # Per round, the loss both sides reach; the time ratio is the median of the rounds'.
    speedups = []
    for gpt, llama in zip(runs["gpt"], runs["llama"], strict=True):
        target = max(min(v for _, v in gpt["curve"]), min(v for _, v in llama["curve"]))
        speedups.append(time_to(llama["curve"], target) / time_to(gpt["curve"], target))
    note = (
        f"d{size['width']}x{size['layers']}, {HEADS} heads / {KV_HEADS} kv, B={size['batch']} "
        f"T={size['seq']}, {size['steps']} steps, Muon+AdamW, {torch.get_num_threads()} "
        f"threads, {size['rounds']} alternated rounds"
    )
    return [
        Figure("hf vs gpt: gpt tokens/s", median(tps["gpt"]), "tok/s", note=note),
        Figure("hf vs gpt: llama tokens/s", median(tps["llama"]), "tok/s"),
        Figure("hf vs gpt: gpt / llama tokens/s", paired_ratio(tps["gpt"], tps["llama"]), "x"),
        Figure(
            "hf vs gpt: llama / gpt time to the same val loss",
            median(speedups),
            "x",
            note="above 1: the built-in GPT gets there sooner",
        ),
    ]

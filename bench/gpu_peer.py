"""The HF peer at the configuration of `python -m trainctl.worker.kinds.benchmark`, with the same
flags: on CUDA by default preset base, micro-batch 4 x grad-accum 8, seq 4096, bf16 autocast,
torch.compile, activation checkpointing, fused AdamW. Prints one JSON object with the
benchmark's fields (tokens/s, MFU, step-time p50/p95, peak memory).

usage: python -m bench.gpu_peer [the benchmark's flags] [--peer-compile-mode MODE]

The peer compiles (where the plan does: `--compile`, the CUDA profile) in inductor's default
mode unless `--peer-compile-mode` says otherwise, where trainctl's benchmark uses
reduce-overhead (CUDA graphs): HF's model under CUDA graphs is not what a user of it runs, and
what the graphs save (kernel launches) is small next to a micro-batch of 16,384 tokens. Both
modes are in the JSON of each side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from bench.hf_peer import build_adamw, build_llama, llama_loss
from trainctl.store.models.presets import ModelConfig
from trainctl.worker.kinds.benchmark import (
    arg_parser,
    flops_per_token,
    peak_flops,
    peak_memory_bytes,
    percentile,
    resolve_args,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = arg_parser("python -m bench.gpu_peer")
    p.description = __doc__
    p.set_defaults(steps=10, warmup_steps=5)
    p.add_argument("--peer-compile-mode", default="default", help="torch.compile mode of the peer")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    plan = resolve_args(args)
    cfg = plan.model.config
    if not isinstance(cfg, ModelConfig):  # the peer is the built-in GPT's Llama twin
        raise SystemExit("the peer mirrors a built-in preset; a transformers model has no twin")
    B, T, accum = plan.batch.micro_batch_size, plan.batch.seq_len, plan.batch.grad_accum_steps
    device = torch.device(plan.device)
    model: Any = build_llama(cfg, T, device=plan.device)
    # Non-reentrant, as trainctl's per-layer checkpointing (and what torch.compile traces).
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    compiled = cfg.use_compile  # --compile / --no-compile, or the device profile's
    mode = args.peer_compile_mode
    if compiled:
        model.compile(mode=None if mode == "default" else mode)
    opt = build_adamw(model)
    on_cuda = device.type == "cuda"

    def step() -> None:
        for _ in range(accum):
            x = torch.randint(0, cfg.vocab_size, (B, T), device=device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_cuda):
                loss = llama_loss(model, x, x)
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # the step's real time, as trainctl's train_step reads its loss

    if on_cuda:  # as trainctl's benchmark: the peak from here on, warm-up steps included
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup_steps):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    tps = args.steps * B * T * accum / sum(times)
    peak = peak_flops(device)
    print(json.dumps({
        "peer": "transformers LlamaForCausalLM (sdpa), AdamW fused",
        "tokens_per_sec": tps,
        "mfu": tps * flops_per_token(cfg, T) / peak if peak else None,
        "step_time_p50_ms": statistics.median(times) * 1000,
        "step_time_p95_ms": percentile(times, 0.95) * 1000,
        "peak_memory_bytes": peak_memory_bytes(device),
        "device": torch.cuda.get_device_name(device) if on_cuda else "cpu",
        "compile": compiled,
        "compile_mode": mode if compiled else None,
        "batch": plan.batch.model_dump(mode="json"),
        "preset": plan.model.preset,
        "torch": torch.__version__,
    }))  # fmt: skip


if __name__ == "__main__":
    main()

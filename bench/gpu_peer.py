"""The HF peer on CUDA at the benchmark configuration of `python -m trainctl.worker.benchmark`
(preset base, micro-batch 4 x grad-accum 8, seq 4096, bf16 autocast, torch.compile, activation
checkpointing, fused AdamW); prints one JSON object like the worker's benchmark.

usage: python -m bench.gpu_peer [--steps N] [--warmup-steps N] [--no-compile]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from bench.hf_peer import build_adamw, build_llama, llama_loss
from trainctl.store.resolve import resolve_benchmark
from trainctl.store.specs import BenchmarkRequest
from trainctl.worker.benchmark import flops_per_token, peak_flops


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args()
    plan = resolve_benchmark(BenchmarkRequest(), cuda_available=True)
    cfg = plan.model.config
    B, T, accum = plan.batch.micro_batch_size, plan.batch.seq_len, plan.batch.grad_accum_steps
    device = torch.device("cuda")
    model: Any = build_llama(cfg, T, device="cuda")
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    if args.compile:
        model.compile()
    opt = build_adamw(model)

    def step() -> None:
        for _ in range(accum):
            x = torch.randint(0, cfg.vocab_size, (B, T), device=device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = llama_loss(model, x, x)
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()

    for _ in range(args.warmup_steps):
        step()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    tps = args.steps * B * T * accum / (time.perf_counter() - started)
    peak = peak_flops(device)
    print(json.dumps({
        "peer": "transformers LlamaForCausalLM (sdpa), AdamW fused",
        "tokens_per_sec": tps,
        "mfu": tps * flops_per_token(cfg, T) / peak if peak else None,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
        "device": torch.cuda.get_device_name(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()

"""Training-throughput benchmark: `python -m worker.benchmark --steps 100 [--json]`.

On CUDA it runs the seed's A100 configuration (preset base, micro-batch 4, grad-accum 8,
seq 4096, MTP off, torch.compile reduce-overhead, per-layer activation checkpointing); on a
CPU-only machine a CPU-sized profile, and says so in `warnings`. Warm-up steps (graph capture,
allocator growth) run first and are not measured.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from store.presets import ModelConfig
from store.specs import BatchSpec, BenchmarkSpec, ModelSpec, resolve_benchmark
from worker.data import create_mock_data_iter
from worker.model import build_model
from worker.optim import OptimizerConfig, build_optimizers
from worker.schedule import build_scheduler

# Dense bf16 peak FLOP/s by device name fragment; MFU is reported only where known.
PEAK_FLOPS = {"A100": 312e12, "H100": 989e12, "H200": 989e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """6·N_matmul for the weights plus 12·L·d·T for attention (PaLM appendix B)."""
    return 6 * cfg.param_counts()["matmul"] + 12 * cfg.n_layers * cfg.d_model * seq_len


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # ru_maxrss is in KiB on Linux: the process's peak resident set, model and data included.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run_benchmark(
    spec: BenchmarkSpec,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Run a resolved BenchmarkSpec; return the benchmark-result shape of DESIGN.md."""
    assert spec.model_config_resolved is not None, "spec must be resolved"
    device = torch.device(spec.device if spec.device != "auto" else "cpu")
    cfg = ModelConfig.from_dict(spec.model_config_resolved)
    B, T = spec.batch.micro_batch_size or 1, spec.batch.seq_len or 1
    accum = spec.batch.grad_accum_steps or 1
    model = build_model(cfg, device=device, seed=spec.seed)
    o = spec.optimizer
    muon, adamw = build_optimizers(
        model,
        OptimizerConfig(
            muon_lr=o.muon_lr, adamw_lr=o.adamw_lr, adamw_betas=(o.adamw_beta1, o.adamw_beta2)
        ),
    )
    scheduler = build_scheduler([muon, adamw], spec.warmup_steps + spec.steps)
    data = create_mock_data_iter(B, T, cfg.vocab_size, device)
    use_autocast = device.type == "cuda"
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def step() -> float:
        for _ in range(accum):
            tokens, targets = next(data)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_autocast):
                loss, _ = model.loss(tokens, targets)
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        muon.step()
        adamw.step()
        muon.zero_grad(set_to_none=True)
        adamw.zero_grad(set_to_none=True)
        scheduler.step()
        return float(loss.item())  # syncs, so the step time is the step's real time

    for i in range(spec.warmup_steps):
        step()
        if on_step:
            on_step({"kind": "warmup", "step": i + 1, "total_steps": spec.warmup_steps})
    times: list[float] = []
    tokens_per_step = B * T * accum
    for i in range(spec.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
        if on_step:
            on_step(
                {
                    "kind": "measure",
                    "step": i + 1,
                    "total_steps": spec.steps,
                    "loss": loss,
                    "tokens_per_sec": tokens_per_step / times[-1],
                    "step_time_sec": times[-1],
                }
            )
        if should_stop and should_stop():
            break
    return summarize(spec, cfg, device, times, tokens_per_step)


def summarize(
    spec: BenchmarkSpec,
    cfg: ModelConfig,
    device: torch.device,
    times: list[float],
    tokens_per_step: int,
) -> dict[str, Any]:
    elapsed = sum(times)
    total_tokens = tokens_per_step * len(times)
    tps = total_tokens / elapsed if elapsed > 0 else 0.0
    peak = peak_flops(device)
    warnings = list(spec.warnings)
    if device.type == "cuda" and peak is None:
        warnings.append(f"unknown peak FLOP/s for {torch.cuda.get_device_name(device)}: no MFU")
    mfu = tps * flops_per_token(cfg, spec.batch.seq_len or 1) / peak if peak else None
    return {
        "total_tokens": total_tokens,
        "elapsed_sec": elapsed,
        "tokens_per_sec": tps,
        "est_days_for_target_tokens": spec.target_tokens / tps / 86400 if tps else None,
        "target_tokens": spec.target_tokens,
        "step_time_p50_ms": statistics.median(times) * 1000 if times else None,
        "step_time_p95_ms": percentile(times, 0.95) * 1000 if times else None,
        "peak_memory_bytes": peak_memory_bytes(device),
        "mfu": mfu,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "warnings": warnings,
        "config": {
            **spec.model_dump(),
            "params": cfg.param_counts(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m worker.benchmark", description=__doc__)
    p.add_argument("--steps", type=int, default=100, help="measured steps")
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--preset", default=None, help="model preset (default: device profile's)")
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--grad-accum-steps", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument(
        "--compile", dest="use_compile", action=argparse.BooleanOptionalAction, default=None
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        spec = resolve_benchmark(
            BenchmarkSpec(
                steps=args.steps,
                warmup_steps=args.warmup_steps,
                model=ModelSpec(preset=args.preset),
                batch=BatchSpec(
                    micro_batch_size=args.micro_batch_size,
                    grad_accum_steps=args.grad_accum_steps,
                    seq_len=args.seq_len,
                ),
                use_compile=args.use_compile,
                device=args.device,
            ),
            cuda_available=torch.cuda.is_available(),
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = run_benchmark(spec)
    if args.json:
        print(json.dumps(result))
        return 0
    for w in result["warnings"]:
        print(f"warning: {w}")
    print(f"device:          {result['device']}")
    print(f"total tokens:    {result['total_tokens']:,}")
    print(f"elapsed:         {result['elapsed_sec']:.2f} s")
    print(f"throughput:      {result['tokens_per_sec']:,.0f} tokens/s")
    print(
        f"step time:       p50 {result['step_time_p50_ms']:.1f} ms, "
        f"p95 {result['step_time_p95_ms']:.1f} ms"
    )
    print(f"peak memory:     {result['peak_memory_bytes'] / 2**30:.2f} GiB")
    if result["mfu"] is not None:
        print(f"MFU:             {result['mfu'] * 100:.1f} %")
    days = result["est_days_for_target_tokens"]
    print(f"est. time for {result['target_tokens'] / 1e9:.2f} B tokens: {days:.1f} days")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Training-throughput benchmark: `python -m trainctl.worker.kinds.benchmark --steps 100 [--json]`.

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

from trainctl.store.kinds.benchmark import BenchmarkPlan, BenchmarkRequest, resolve_benchmark
from trainctl.store.models.hf_config import AnyModelConfig, HfModelConfig
from trainctl.store.models.plugin import PluginModelConfig
from trainctl.store.models.presets import ModelConfig
from trainctl.store.specs import BatchSpec, ModelSpec
from trainctl.worker.context import RunContext
from trainctl.worker.data.loader import SyntheticSampler
from trainctl.worker.executor import Outcome, WorkerEnv, check_device, read_plan, stopped_outcome
from trainctl.worker.stops import maybe_stop
from trainctl.worker.training.loop import build_training, data_loader, train_step

# Dense bf16 peak FLOP/s by device name fragment; MFU is reported only where known.
PEAK_FLOPS = {"A100": 312e12, "H100": 989e12, "H200": 989e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """6·N_matmul for the weights plus 12·L·d·T for attention (ModelConfig.flops_per_token)."""
    return float(cfg.flops_per_token(seq_len))


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # ru_maxrss is in KiB on Linux: the process's peak resident set, model and data included.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run_benchmark(
    plan: BenchmarkPlan,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Run a benchmark plan; return the benchmark-result shape (docs/design/shapes.md).

    It times the training step itself (`build_training`, `train_step`, the async loader) on
    synthetic tokens, so every optimizer and schedule setting of the plan is the one timed.
    """
    b = plan.batch
    sampler = SyntheticSampler(
        b.micro_batch_size, b.seq_len, plan.model.config.vocab_size, seed=plan.seed
    )
    parts = build_training(plan, sampler, [], total_steps=plan.warmup_steps + plan.steps)
    if parts.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(parts.device)
    loader = data_loader(parts, 0)
    try:
        for i in range(plan.warmup_steps):
            maybe_stop()  # nothing is measured yet: a stop here has no result to give
            train_step(parts, loader, i)
            if on_step:
                on_step({"kind": "warmup", "step": i + 1, "total_steps": plan.warmup_steps})
        times: list[float] = []
        for i in range(plan.steps):
            t0 = time.perf_counter()
            # train_step reads the loss back (.item()), so the time is the step's real time.
            loss = train_step(parts, loader, plan.warmup_steps + i)["loss"]
            times.append(time.perf_counter() - t0)
            if on_step:
                on_step(
                    {
                        "kind": "measure",
                        "step": i + 1,
                        "total_steps": plan.steps,
                        "loss": loss,
                        "tokens_per_sec": b.tokens_per_step / times[-1],
                        "step_time_sec": times[-1],
                    }
                )
            if should_stop and should_stop():
                break
    finally:
        loader.close()
    return summarize(plan, parts.device, times, parts.model)


def model_flops(
    cfg: AnyModelConfig, model: torch.nn.Module | None, seq_len: int
) -> tuple[float, dict[str, int], str]:
    """FLOPs per token, the parameter counts, and which formula gave them. A transformers
    model's parameters are counted on the model itself (its embedding lookup is no matmul)."""
    if isinstance(cfg, PluginModelConfig):
        assert model is not None, "a plug-in model is counted on the model"
        total = sum(p.numel() for p in model.parameters())
        declared = model.flops_per_token(seq_len)  # type: ignore[operator]
        if declared is not None:
            return declared, {"total": total}, f"plug-in {cfg.plugin}: its own flops_per_token"
        return 6 * total, {"total": total}, "counted parameters: 6N (plug-in declares none)"
    if not isinstance(cfg, HfModelConfig):
        return flops_per_token(cfg, seq_len), cfg.param_counts(), "gpt: 6N + 12LdT"
    assert model is not None, "a transformers model is counted on the model"
    total = sum(p.numel() for p in model.parameters())
    embedding = model.inner.get_input_embeddings().weight.numel()  # type: ignore[union-attr, operator]
    matmul = total - embedding
    sizes = cfg.sizes()
    flops = 6 * matmul + 12 * sizes["layers"] * sizes["d_model"] * seq_len
    return flops, {"total": total, "matmul": matmul}, "counted parameters: 6N + 12LdT"


def summarize(
    plan: BenchmarkPlan,
    device: torch.device,
    times: list[float],
    model: torch.nn.Module | None = None,
) -> dict[str, Any]:
    cfg = plan.model.config
    flops, params, flops_source = model_flops(cfg, model, plan.batch.seq_len)
    elapsed = sum(times)
    total_tokens = plan.batch.tokens_per_step * len(times)
    tps = total_tokens / elapsed if elapsed > 0 else 0.0
    peak = peak_flops(device)
    warnings = list(plan.warnings)
    if device.type == "cuda" and peak is None:
        warnings.append(f"unknown peak FLOP/s for {torch.cuda.get_device_name(device)}: no MFU")
    mfu = tps * flops / peak if peak else None
    return {
        "total_tokens": total_tokens,
        "elapsed_sec": elapsed,
        "tokens_per_sec": tps,
        "est_days_for_target_tokens": plan.target_tokens / tps / 86400 if tps else None,
        "target_tokens": plan.target_tokens,
        "step_time_p50_ms": statistics.median(times) * 1000 if times else None,
        "step_time_p95_ms": percentile(times, 0.95) * 1000 if times else None,
        "peak_memory_bytes": peak_memory_bytes(device),
        "mfu": mfu,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "warnings": warnings,
        "config": {
            **plan.model_dump(mode="json"),
            "params": params,
            "flops_per_token": flops_source,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
    }


def execute_benchmark(ctx: RunContext, env: WorkerEnv) -> Outcome:
    plan = read_plan(ctx, BenchmarkPlan)
    check_device(plan.device)
    result = run_benchmark(plan, on_step=ctx.metrics, should_stop=ctx.should_stop)
    if result["total_tokens"] < plan.steps * plan.batch.tokens_per_step:
        return stopped_outcome(ctx, result)
    return Outcome("succeeded", result)


def arg_parser(prog: str = "python -m trainctl.worker.kinds.benchmark") -> argparse.ArgumentParser:
    """The benchmark's flags; bench/gpu_peer.py takes the same ones for its HF peer."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__)
    p.add_argument("--steps", type=int, default=100, help="measured steps")
    p.add_argument("--warmup-steps", type=int, default=10)
    model = p.add_mutually_exclusive_group()
    model.add_argument("--preset", default=None, help="model preset (default: device profile's)")
    model.add_argument(
        "--hf",
        type=json.loads,
        default=None,
        metavar="JSON",
        help='a transformers architecture instead, as a request names it: {"model_type": ...}',
    )
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--grad-accum-steps", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument(
        "--compile", dest="use_compile", action=argparse.BooleanOptionalAction, default=None
    )
    p.add_argument(
        "--compile-mode",
        choices=["default", "reduce-overhead", "max-autotune"],
        default=None,
        help="torch.compile mode (default: reduce-overhead)",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return arg_parser().parse_args(argv)


def resolve_args(args: argparse.Namespace) -> BenchmarkPlan:
    """The plan of the flags, resolved for this machine; ValueError for an invalid one."""
    return resolve_benchmark(
        BenchmarkRequest(
            steps=args.steps,
            warmup_steps=args.warmup_steps,
            model=ModelSpec(hf=args.hf) if args.hf is not None else ModelSpec(preset=args.preset),
            batch=BatchSpec(
                micro_batch_size=args.micro_batch_size,
                grad_accum_steps=args.grad_accum_steps,
                seq_len=args.seq_len,
            ),
            use_compile=args.use_compile,
            compile_mode=args.compile_mode,
            device=args.device,
        ),
        cuda_available=torch.cuda.is_available(),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = resolve_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = run_benchmark(plan)
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

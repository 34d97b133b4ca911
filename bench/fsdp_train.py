"""A sharded train run (parallelism fsdp) through the worker's launcher: item `fsdp_1b` /
`fsdp_8b` of the GPU session (bench/gpu.sh).

Resolves a train request as submit does (`store.kinds.train.resolve_train`: the device
profile, the batch split across the ranks), asks the store's memory estimate whether it fits
the GPUs (`store.kinds.train.train_need`; exit 3 with the numbers when it does not, which gpu.sh
reports as a skip), then runs it with `worker.launch.launch_train` on `--nproc` local ranks,
without a service. Writes one JSON object (`--json PATH`): the estimate, the losses, tokens/s
and step time of the logged steps, and the wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainctl.store.kinds.train import TrainRequest, resolve_train, train_need
from trainctl.store.training.memory import gib, node_bytes
from trainctl.store.worker_settings import WorkerSettings

DOES_NOT_FIT = 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.fsdp_train", description=__doc__)
    p.add_argument("--json", required=True, metavar="PATH", help="write the result here")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--preset", default="1b")
    p.add_argument("--nproc", type=int, default=1, help="ranks (GPUs) on this node")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument("--grad-accum-steps", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--checkpoint", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--memory-gib", type=float, help="each GPU's memory (default: GPU 0's)")
    return p.parse_args(argv)


def gpu_memory_bytes(args: argparse.Namespace) -> int | None:
    if args.memory_gib is not None:
        return int(args.memory_gib * 2**30)
    if args.device != "cuda":
        return None
    import torch

    return int(torch.cuda.get_device_properties(0).total_memory)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    accum = args.grad_accum_steps or args.nproc
    request = TrainRequest(
        experiment="fsdp",
        steps=args.steps,
        log_every=1,
        device=args.device,
        model={"preset": args.preset, "overrides": {"use_checkpoint_per_layer": True}},
        data={"source": "synthetic"},
        batch={
            "micro_batch_size": args.micro_batch_size,
            "grad_accum_steps": accum,
            "seq_len": args.seq_len,
        },
        checkpoint_every=args.steps if args.checkpoint else 10**6,
        val_batches=1,
        nproc_per_node=args.nproc,
        parallelism={"strategy": "fsdp"},
    )
    plan = resolve_train(request, cuda_available=args.device == "cuda", data_roots=[])
    need = train_need(plan)
    per_gpu = node_bytes(need.estimate, 1, plan.device)
    report: dict[str, Any] = {
        "preset": args.preset,
        "nproc": args.nproc,
        "estimate_gib": round(per_gpu / 2**30, 1),
        "estimate": need.estimate.describe(),
    }
    limit = gpu_memory_bytes(args)
    print(f"estimate per rank: {gib(per_gpu)} ({need.estimate.describe()})", flush=True)
    if limit is not None and per_gpu > limit:
        report["skipped"] = f"needs about {gib(per_gpu)} per GPU, more than {gib(limit)}"
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(report["skipped"])
        return DOES_NOT_FIT
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trainctl-fsdp-bench-") as tmp:
        result = launch(plan, Path(tmp))
    train = [m for m in result.pop("metrics") if m["kind"] == "train"]
    report |= {
        "wall_sec": round(time.perf_counter() - started, 1),
        "losses": [m["loss"] for m in train],
        "tokens_per_sec": [round(m["tokens_per_sec"]) for m in train],
        "step_time_sec": [round(m["step_time_sec"], 3) for m in train],
        "result": result,
    }
    Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps(report, default=str))
    return 0


def launch(plan: Any, root: Path) -> dict[str, Any]:
    from trainctl.worker.launch import launch_train  # torch: only once the run fits

    result = launch_train(plan, WorkerSettings(data_dir=root), ctx=None)
    assert result is not None
    return result


if __name__ == "__main__":
    sys.exit(main())

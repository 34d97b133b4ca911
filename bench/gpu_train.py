"""A train run as a user runs one, then its resume: item 1 of the GPU session (bench/gpu.sh,
docs/performance.md item 7).

`python -m trainctl.service` (SQLite and checkpoints in a fresh data folder, no local
workers) and one `python -m trainctl.worker` beside it on the same folder; the runs are
submitted with the CLI (`python -m trainctl.service.cli submit train --spec FILE --json`), so
the API resolves them (device profile, memory check, the resume point pinned), the worker
claims and trains them. The first run trains `--steps` steps with asynchronous checkpoints,
the second resumes from its latest checkpoint (`resume_from: latest`) for `--resume-steps`
more. On CUDA the defaults are `base` at micro-batch 4 x seq 4096 (one micro-batch a step:
the shapes of the benchmark's micro-batches, so inductor's cache serves both), bf16 autocast,
torch.compile reduce-overhead and per-layer activation checkpointing.

Writes one JSON object (`--json PATH`): each run's state, steps, losses, tokens/s, step time,
checkpoint save times and wall time, and `checks`, each true or false; exits 1 unless every
check holds. The service's and the worker's logs go to `--logs DIR`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, running_service
from trainctl.service.sdk.client import TrainctlClient


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_train", description=__doc__)
    p.add_argument("--json", required=True, metavar="PATH", help="write the result here")
    p.add_argument(
        "--logs", metavar="DIR", help="the service's and worker's logs (default: the data folder)"
    )
    p.add_argument("--data-dir", help="the service's data folder (default: a temporary one)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--preset", default="base")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--resume-steps", type=int, default=10)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--grad-accum-steps", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--compile-mode", default="reduce-overhead")
    p.add_argument(
        "--data",
        choices=["stdlib", "synthetic"],
        default="stdlib",
        help="stdlib: the loss falls, so a resume from scratch would show",
    )
    p.add_argument("--timeout", type=float, default=900, help="seconds for each run")
    return p.parse_args(argv)


def spec(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {"use_checkpoint_per_layer": True, "use_compile": args.compile}
    if args.compile:
        overrides["compile_mode"] = args.compile_mode
    data: dict[str, Any] = {"source": args.data}
    if args.data == "stdlib":
        data["max_bytes"] = 4_000_000
    return {
        "experiment": "gpu-train",
        "steps": args.steps,
        "device": args.device,
        "model": {"preset": args.preset, "overrides": overrides},
        "data": data,
        "batch": {
            "micro_batch_size": args.micro_batch_size,
            "grad_accum_steps": args.grad_accum_steps,
            "seq_len": args.seq_len,
        },
        "checkpoint_every": max(args.steps // 2, 1),
        "val_every": args.steps,
        "val_batches": 1,
        "async_checkpoint": True,
        "log_every": 1,
    }


def submit(url: str, spec_file: Path) -> str:
    """Queue a train run with the CLI, as a user does; its id."""
    command = [sys.executable, "-m", "trainctl.service.cli", "--url", url]
    command += ["submit", "train", "--spec", str(spec_file), "--json"]
    out = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"trainctl submit train failed ({out.returncode}): {out.stderr}")
    return str(json.loads(out.stdout)["id"])


def describe(api: TrainctlClient, run_id: str, wall: float) -> dict[str, Any]:
    """A finished run as the API reports it: state, losses by step, speed, saves."""
    run = api.get_run(run_id)
    train = [m.model_dump() for m in api.metrics(run_id, "train")]
    saves = [
        e.data["checkpoint"]
        for e in api.events(run_id)
        if e.type == "log" and isinstance(e.data.get("checkpoint"), dict)
    ]
    later = train[1:] or train  # the first step pays for the compile
    return {
        "id": run_id,
        "state": run.state,
        "error": run.error,
        "result": run.result,
        "resume_from": run.spec.get("resume_from"),
        "steps": [m["step"] for m in train],
        "losses": [m["loss"] for m in train],
        "first_step_sec": train[0]["step_time_sec"] if train else None,
        "tokens_per_sec": statistics.median(m["tokens_per_sec"] for m in later) if train else None,
        "step_time_p50_ms": statistics.median(m["step_time_sec"] for m in later) * 1000
        if train
        else None,
        "checkpoints": saves,
        "logs": [entry.message for entry in api.logs(run_id)],
        "wall_sec": wall,
    }


def run_to_end(api: TrainctlClient, url: str, spec_file: Path, timeout: float) -> dict[str, Any]:
    started = time.perf_counter()
    run_id = submit(url, spec_file)
    with contextlib.suppress(TimeoutError):  # then described as it is: still running
        api.wait(run_id, timeout=timeout, poll=1.0)
    return describe(api, run_id, time.perf_counter() - started)


def checks(first: dict[str, Any], second: dict[str, Any], n: int, m: int) -> dict[str, bool]:
    pinned = second["resume_from"] or {}
    saved = [c["step"] for c in first["checkpoints"] if str(c["tag"]).startswith("step_")]
    a, b = first["losses"], second["losses"]
    return {
        "first_run_succeeded": first["state"] == "succeeded",
        "first_run_trained_every_step": first["steps"] == list(range(1, n + 1)),
        "async_checkpoints_committed": saved == sorted({max(n // 2, 1), n}),
        "resume_pinned_the_last_checkpoint": pinned.get("tag") == f"step_{n}",
        "second_run_succeeded": second["state"] == "succeeded",
        "second_run_continued_from_the_saved_step": second["steps"]
        == list(range(n + 1, n + m + 1)),
        # From the trained weights, not from scratch: the first resumed loss is nearer the
        # last loss of the first run than its first.
        "second_run_started_from_the_trained_weights": bool(a and b)
        and abs(b[0] - a[-1]) < abs(b[0] - a[0]),
    }


def stop(proc: subprocess.Popen[bytes], grace: float = 60) -> int | None:
    """SIGTERM (a worker finishes its step and exits), then SIGKILL after `grace` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="trainctl-gpu-train-"))
    logs = Path(args.logs or data_dir)
    logs.mkdir(parents=True, exist_ok=True)
    first_spec, second_spec = spec(args), spec(args)
    second_spec |= {"steps": args.steps + args.resume_steps, "resume_from": "latest"}
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "first.json").write_text(json.dumps(first_spec))
    (data_dir / "second.json").write_text(json.dumps(second_spec))
    report: dict[str, Any] = {"specs": [first_spec, second_spec], "runs": []}
    started = time.perf_counter()
    with running_service(data_dir, workers=0) as svc:
        # service.log stays in the data folder (bench.common); the worker's goes with it.
        with open(logs / "worker.log", "ab") as worker_log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "trainctl.worker", "--data-dir", str(data_dir)],
                cwd=REPO,
                env={**os.environ, "TRAINCTL_DATA_DIR": str(data_dir)},
                stdout=worker_log,
                stderr=subprocess.STDOUT,
            )
        try:
            with TrainctlClient(svc.url) as api:
                for s in ("first.json", "second.json"):
                    run = run_to_end(api, svc.url, data_dir / s, args.timeout)
                    report["runs"].append(run)
                    print(
                        f"{s[:-5]} run: {run['state']}, steps {run['steps'][:1]}..."
                        f"{run['steps'][-1:]}, {run['wall_sec']:.0f} s",
                        flush=True,
                    )
                    if run["state"] != "succeeded":
                        break
        finally:
            report["worker_exit_code"] = stop(worker)
    if logs != data_dir and (data_dir / "service.log").exists():
        (logs / "service.log").write_bytes((data_dir / "service.log").read_bytes())
    runs = report["runs"]
    report["checks"] = (
        checks(runs[0], runs[1], args.steps, args.resume_steps)
        if len(runs) == 2
        else {"both_runs_succeeded": False}
    )
    report["ok"] = all(report["checks"].values())
    report["wall_sec"] = time.perf_counter() - started
    Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    for name, ok in report["checks"].items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

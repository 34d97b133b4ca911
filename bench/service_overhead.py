"""Item 1: a benchmark run submitted over the API against `python -m trainctl.worker.kinds.benchmark
--json` with the same resolved config, alternated pair by pair."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    Figure,
    alternate,
    median,
    paired_ratio,
    running_service,
    wait_run,
)
from trainctl.service.sdk.client import TrainctlClient
from trainctl.store.kinds.benchmark import BenchmarkRequest, resolve_benchmark

# The CPU benchmark profile (preset tiny, grad-accum 3, seq 512) at micro-batch 4 instead of
# 16: a step of about a second keeps 3 pairs within minutes on a loaded 2-core machine, and
# shorter steps make any per-step service cost (events, heartbeats) weigh more, not less.
FULL: dict[str, Any] = dict(steps=10, warmup_steps=2, pairs=3, micro_batch_size=4)
QUICK: dict[str, Any] = dict(steps=3, warmup_steps=1, pairs=3, micro_batch_size=2)


def direct(spec: dict[str, Any]) -> dict[str, Any]:
    b = spec["batch"]
    args = [
        "--steps", str(spec["steps"]),
        "--warmup-steps", str(spec["warmup_steps"]),
        "--preset", spec["model"]["preset"],
        "--micro-batch-size", str(b["micro_batch_size"]),
        "--grad-accum-steps", str(b["grad_accum_steps"]),
        "--seq-len", str(b["seq_len"]),
        "--compile" if spec["model"]["config"]["use_compile"] else "--no-compile",
        "--device", spec["device"],
        "--json",
    ]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "trainctl.worker.kinds.benchmark", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    request = {
        "steps": size["steps"],
        "warmup_steps": size["warmup_steps"],
        "device": "cpu",
        "batch": {"micro_batch_size": size["micro_batch_size"]},
    }
    # The same resolve the API runs, so the direct side gets the same config; checked below.
    spec = resolve_benchmark(BenchmarkRequest(**request), cuda_available=False).model_dump()
    tps: dict[str, list[float]] = {"api": [], "cli": []}
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_service(Path(tmp) / "data") as svc,
        TrainctlClient(svc.url) as client,
    ):

        def over_api() -> float:
            done = wait_run(client, client.submit_benchmark(**request).id)
            if done["spec"]["model"]["config"] != spec["model"]["config"]:
                raise RuntimeError("the API resolved another model config than the CLI")
            return float(done["result"]["tokens_per_sec"])

        tps = alternate(
            {"api": over_api, "cli": lambda: direct(spec)["tokens_per_sec"]}, size["pairs"]
        )
    b = spec["batch"]
    note = (
        f"CPU profile (preset {spec['model']['preset']}, B={b['micro_batch_size']} x "
        f"{b['grad_accum_steps']}, T={b['seq_len']}), {size['steps']} measured steps, "
        f"{size['pairs']} alternated pairs"
    )
    return [
        Figure("service overhead: API benchmark tokens/s", median(tps["api"]), "tok/s", note=note),
        Figure(
            "service overhead: python -m trainctl.worker.kinds.benchmark tokens/s",
            median(tps["cli"]),
            "tok/s",
        ),
        Figure(
            "service overhead: API / direct", paired_ratio(tps["api"], tps["cli"]), "x", target=0.97
        ),
    ]

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from store.presets import get_preset
from store.specs import BENCHMARK_PROFILES, BenchmarkSpec, resolve_benchmark
from worker.benchmark import flops_per_token, run_benchmark

REPO = Path(__file__).resolve().parents[2]
RESULT_FIELDS = {
    "total_tokens",
    "elapsed_sec",
    "tokens_per_sec",
    "est_days_for_target_tokens",
    "target_tokens",
    "step_time_p50_ms",
    "step_time_p95_ms",
    "peak_memory_bytes",
    "mfu",
    "device",
    "warnings",
    "config",
}


def test_cuda_profile_is_the_seed_a100_configuration() -> None:
    spec = resolve_benchmark(BenchmarkSpec(), cuda_available=True)
    assert spec.model.preset == "base"
    assert (spec.batch.micro_batch_size, spec.batch.grad_accum_steps, spec.batch.seq_len) == (
        4,
        8,
        4096,
    )
    assert spec.use_compile and spec.compile_mode == "reduce-overhead"
    assert spec.use_checkpoint_per_layer
    assert spec.model_config_resolved and spec.model_config_resolved["mtp_depth"] == 0
    assert not spec.warnings


def test_cpu_profile_is_stated_as_a_warning() -> None:
    spec = resolve_benchmark(BenchmarkSpec(), cuda_available=False)
    assert spec.model.preset == BENCHMARK_PROFILES["cpu"].preset
    assert any("CPU profile" in w for w in spec.warnings)


def test_benchmark_reports_every_field_and_consistent_totals() -> None:
    spec = resolve_benchmark(
        BenchmarkSpec(steps=3, warmup_steps=1, batch={"micro_batch_size": 2, "seq_len": 32}),
        cuda_available=False,
    )
    result = run_benchmark(spec)
    assert set(result) == RESULT_FIELDS
    tokens_per_step = 2 * 32 * spec.batch.grad_accum_steps  # type: ignore[operator]
    assert result["total_tokens"] == 3 * tokens_per_step
    assert result["tokens_per_sec"] == pytest.approx(result["total_tokens"] / result["elapsed_sec"])
    assert result["est_days_for_target_tokens"] == pytest.approx(
        8.31e9 / result["tokens_per_sec"] / 86400
    )
    assert result["mfu"] is None and result["device"] == "cpu"


def test_flops_per_token_follows_the_design_formula() -> None:
    cfg = get_preset("base")
    expected = 6 * cfg.param_counts()["matmul"] + 12 * 24 * 1024 * 4096
    assert flops_per_token(cfg, 4096) == expected


def test_cli_prints_one_json_object() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "worker.benchmark",
            "--steps",
            "2",
            "--warmup-steps",
            "1",
            "--micro-batch-size",
            "2",
            "--seq-len",
            "32",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)) == RESULT_FIELDS


def test_cli_rejects_an_unknown_preset_in_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "worker.benchmark", "--preset", "huge"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "unknown model preset 'huge'" in proc.stderr

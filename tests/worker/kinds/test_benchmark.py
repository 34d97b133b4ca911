from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.plans import benchmark_plan
from trainctl.store.kinds.benchmark import BenchmarkRequest, resolve_benchmark
from trainctl.store.models.hf_config import HfModelConfig
from trainctl.store.models.presets import ModelConfig, get_preset
from trainctl.store.resolve import BENCHMARK_PROFILES
from trainctl.store.specs import ScheduleSpec
from trainctl.store.training.optim import OptimizerSpec
from trainctl.worker.kinds.benchmark import flops_per_token, parse_args, resolve_args, run_benchmark

REPO = Path(__file__).resolve().parents[3]
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
    plan = resolve_benchmark(BenchmarkRequest(), cuda_available=True)
    assert plan.model.preset == "base"
    b = plan.batch
    assert (b.micro_batch_size, b.grad_accum_steps, b.seq_len) == (4, 8, 4096)
    cfg = plan.model.config
    assert isinstance(cfg, ModelConfig)
    assert cfg.use_compile and cfg.compile_mode == "reduce-overhead"
    assert cfg.use_checkpoint_per_layer
    assert cfg.mtp_depth == 0
    assert not plan.warnings


def test_cpu_profile_is_stated_as_a_warning() -> None:
    plan = benchmark_plan()
    assert plan.model.preset == BENCHMARK_PROFILES["cpu"].preset
    assert any("CPU profile" in w for w in plan.warnings)


@pytest.mark.slow
def test_benchmark_reports_every_field_and_consistent_totals() -> None:
    plan = benchmark_plan(steps=3, warmup_steps=1, batch={"micro_batch_size": 2, "seq_len": 32})
    result = run_benchmark(plan)
    assert set(result) == RESULT_FIELDS
    tokens_per_step = 2 * 32 * plan.batch.grad_accum_steps
    assert result["total_tokens"] == 3 * tokens_per_step
    assert result["tokens_per_sec"] == pytest.approx(result["total_tokens"] / result["elapsed_sec"])
    assert result["est_days_for_target_tokens"] == pytest.approx(
        8.31e9 / result["tokens_per_sec"] / 86400
    )
    assert result["mfu"] is None and result["device"] == "cpu"


# A value other than the default for every field of the optimizer and the schedule: the
# benchmark must run each of them (it times the training step, not a copy of it).
CHANGED: dict[str, dict[str, Any]] = {
    "optimizer": {
        "kind": "adamw",
        "muon_lr": 0.05,
        "muon_momentum": 0.5,
        "muon_weight_decay": 0.9,
        "muon_adjust_lr_fn": "match_rms_adamw",
        "adamw_lr": 0.03,
        "adamw_beta1": 0.5,
        "adamw_beta2": 0.5,
        "adamw_eps": 0.1,
        "adamw_weight_decay": 0.9,
        "grad_clip": 1e-3,
    },
    "schedule": {
        "warmup_frac": 0.5,
        "stable_frac": 0.5,
        "decay": "cosine",
        "min_lr_ratio": 0.5,
        "warmup_steps": 1,
        "decay_start": 3,
        "decay_steps": 2,
    },
}
# Over 8 steps: 2 warming up, 2 stable, 4 decaying, so every schedule field matters.
BASE_SCHEDULE = {"warmup_frac": 0.25, "stable_frac": 0.25}


def measured_losses(optimizer: Any = None, schedule: Any = None) -> list[float]:
    losses: list[float] = []
    plan = benchmark_plan(
        steps=8,
        warmup_steps=0,
        batch={"micro_batch_size": 2, "seq_len": 32, "grad_accum_steps": 1},
        optimizer=optimizer or {},
        schedule=BASE_SCHEDULE | (schedule or {}),
    )
    run_benchmark(plan, on_step=lambda m: losses.append(m["loss"]))
    return losses


def test_the_changes_cover_every_optimizer_and_schedule_field() -> None:
    assert set(CHANGED["optimizer"]) == set(OptimizerSpec.model_fields)
    assert set(CHANGED["schedule"]) == set(ScheduleSpec.model_fields)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("group", "field"), [(g, f) for g, fields in CHANGED.items() for f in fields]
)
def test_every_optimizer_and_schedule_field_of_a_benchmark_changes_what_runs(
    group: str, field: str
) -> None:
    baseline = measured_losses()

    changed = measured_losses(**{group: {field: CHANGED[group][field]}})

    assert changed[0] == baseline[0]  # the first loss is computed before any update
    assert changed != baseline


def test_flops_per_token_follows_the_design_formula() -> None:
    cfg = get_preset("base")
    expected = 6 * cfg.param_counts()["matmul"] + 12 * 24 * 1024 * 4096
    assert flops_per_token(cfg, 4096) == expected


@pytest.mark.slow
def test_cli_prints_one_json_object() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainctl.worker.kinds.benchmark",
            "--steps",
            "2",
            "--warmup-steps",
            "1",
            "--micro-batch-size",
            "2",
            "--seq-len",
            "32",
            "--compile-mode",
            "max-autotune",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result) == RESULT_FIELDS
    assert result["config"]["model"]["config"]["compile_mode"] == "max-autotune"


@pytest.mark.slow
def test_cli_rejects_an_unknown_preset_in_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainctl.worker.kinds.benchmark", "--preset", "huge"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "unknown model preset 'huge'" in proc.stderr


def test_the_cli_benchmarks_a_transformers_architecture_named_by_its_config() -> None:
    """--hf names a model as a request's model.hf does (bench/gpu.sh's llama_base)."""
    llama = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2}
    plan = resolve_args(parse_args(["--device", "cpu", "--hf", json.dumps(llama)]))

    assert plan.model.hf == llama and plan.model.preset is None
    assert isinstance(plan.model.config, HfModelConfig)
    assert plan.model.config.model_type == "llama"
    with pytest.raises(SystemExit):
        parse_args(["--preset", "tiny", "--hf", json.dumps(llama)])  # one model or the other

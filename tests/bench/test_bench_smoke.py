"""The bench suite at toy sizes, so that it keeps running; its timings are never checked."""

from __future__ import annotations

import math

import pytest

from bench import (
    bits_per_byte,
    checkpoint_io,
    claims,
    evals_throughput,
    event_streams,
    generate,
    hf_train,
    hf_vs_gpt,
    loss_health,
    model_step,
    time_to_quality,
    tokenize,
)


def test_bench_measurements_run_at_toy_sizes_and_report_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("transformers", reason="the HF peer needs the bench extra")
    monkeypatch.setattr(
        model_step, "QUICK", dict(preset="tiny", n_layers=1, batch=1, seq=16, steps=1, rounds=1)
    )
    monkeypatch.setattr(checkpoint_io, "QUICK", dict(preset="tiny", n_layers=1, rounds=1))
    monkeypatch.setattr(
        time_to_quality,
        "QUICK",
        {**time_to_quality.QUICK, "steps": 4, "eval_every": 2, "B": 2, "T": 16},
    )
    figures = [
        *model_step.run(quick=True),
        *checkpoint_io.run(quick=True),
        *time_to_quality.run(quick=True),
    ]
    names = [f.name for f in figures]
    assert len(names) == len(set(names))
    assert all(math.isfinite(f.value) and f.value > 0 for f in figures), figures
    assert any(f.target is not None for f in figures)


def test_the_transformers_train_loop_measurement_runs_at_toy_sizes() -> None:
    pytest.importorskip("transformers", reason="the llama side needs the worker extra")
    figures = hf_train.run(quick=True)

    assert all(math.isfinite(f.value) and f.value > 0 for f in figures), figures
    names = [f.name for f in figures]
    assert "hf train: trainctl loop / plain loop" in names
    assert "hf train: benchmark run / trainctl loop" in names


def test_the_builtin_against_transformers_measurement_runs_at_toy_sizes() -> None:
    """Both sides must reach the loss it times them to, or `time_to` raises."""
    pytest.importorskip("transformers", reason="the llama side needs the worker extra")
    figures = hf_vs_gpt.run(quick=True)

    assert all(math.isfinite(f.value) and f.value > 0 for f in figures), figures
    assert "hf vs gpt: llama / gpt time to the same val loss" in [f.name for f in figures]


def test_the_evals_throughput_measurement_runs_at_toy_sizes() -> None:
    """trainctl's scorer and lm-evaluation-harness's HFLM on the same items (9 s)."""
    pytest.importorskip("lm_eval", reason="the dev extra installs lm-evaluation-harness")
    figures = evals_throughput.run(quick=True)

    assert all(math.isfinite(f.value) and f.value > 0 for f in figures), figures
    assert [f.name for f in figures if f.target] == [
        "evals 0-shot: trainctl / lm-eval",
        "evals 5-shot: trainctl / lm-eval",
    ]


def test_dataset_measurements_run_at_toy_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokenize, "QUICK", dict(vocab=300, speed_mb=1, rounds=1, rss_mb=(1, 2)))
    monkeypatch.setattr(
        bits_per_byte,
        "QUICK",
        dict(seconds=0.5, calibrate=3, files=60, vocab=300, B=2, T=32, val_batches=1),
    )
    figures = [*tokenize.run(quick=True), *bits_per_byte.run(quick=True)]

    assert all(math.isfinite(f.value) and f.value > 0 for f in figures), figures
    assert [f.name for f in figures if f.name.startswith("bits per byte")] == [
        "bits per byte: bytes", "bits per byte: BPE 300", "bits per byte: bytes / BPE",
    ]  # fmt: skip


def test_the_generation_measurement_runs_at_toy_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers", reason="the HF peer needs the bench extra")
    monkeypatch.setattr(
        generate, "QUICK", dict(sizes=["tiny"], batches=[1, 2], prompt=4, new=8, rounds=1)
    )
    figures = generate.run(quick=True)

    assert all(math.isfinite(f.value) and f.value > 0 for f in figures), figures
    assert any("transformers" in f.name or "peer" in f.name for f in figures), figures


def test_the_claims_measurement_runs_on_postgresql_at_toy_sizes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(claims, "QUICK", dict(rounds=3, depths=(16, 48), workers=8))
    figures = claims.run(quick=True)

    assert all(math.isfinite(f.value) and f.value > 0 for f in figures), figures
    names = [f.name for f in figures]
    assert len(names) == len(set(names))
    assert "claims: gang / 1-node, median" in names
    assert "claims: throughput 48 / 16 queued" in names


def test_the_event_streams_measurement_runs_at_toy_sizes() -> None:
    """Every stream it opens must be answered 200, or it raises: the service holds them."""
    figures = event_streams.run(quick=True)

    assert all(math.isfinite(f.value) and f.value > 0 for f in figures), figures
    assert "event streams: 20 open / none" in [f.name for f in figures]


def test_the_object_storage_measurement_runs_at_toy_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its own SeaweedFS, both uploads (ours and rclone's, from the bench extra, which the
    dev extra installs) and both resumes."""
    from bench import s3_checkpoint

    monkeypatch.setattr(s3_checkpoint, "QUICK", dict(preset="tiny", n_layers=1, rounds=1))
    figures = s3_checkpoint.run(quick=True)

    assert all(math.isfinite(f.value) and f.value > 0 for f in figures), figures
    assert "s3: trainctl upload / rclone copy" in [f.name for f in figures]


def test_the_loss_health_measurement_runs_at_toy_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        loss_health, "QUICK", dict(preset="tiny", n_layers=1, batch=1, seq=16, steps=1, rounds=1)
    )
    figures = {f.name: f for f in loss_health.run(quick=True)}
    assert figures["loss health: steps trained again per rewind"].value == 3
    # Finite, not positive: a rewind's seconds beyond the clean run are within the noise.
    assert all(math.isfinite(f.value) for f in figures.values())

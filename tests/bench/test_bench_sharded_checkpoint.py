"""The sharded checkpoint measurement at toy sizes (two spawned gloo ranks), so that it keeps
running; its timings are never checked."""

from __future__ import annotations

import math

import pytest

from bench import sharded_checkpoint


def test_the_sharded_checkpoint_measurement_runs_at_toy_sizes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sharded_checkpoint, "QUICK", dict(preset="tiny", n_layers=1, rounds=1))
    figures = sharded_checkpoint.run(quick=True)

    assert all(math.isfinite(f.value) and f.value > 0 for f in figures), figures
    names = [f.name for f in figures]
    assert "sharded checkpoint: async stall / sync sharded save" in names
    assert len(names) == len(set(names))

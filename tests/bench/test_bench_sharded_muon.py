"""bench/sharded_muon.py at toy sizes, so that it keeps running; its timings are never checked."""

from __future__ import annotations

import math

import pytest

from bench import sharded_muon


@pytest.mark.slow
def test_the_sharded_muon_measurement_runs_at_toy_sizes_and_counts_collectives() -> None:
    figures = {f.name: f.value for f in sharded_muon.run(quick=True)}

    assert all(math.isfinite(v) and v > 0 for v in figures.values()), figures
    assert figures["sharded muon: collectives/step, ShardedMuon"] == 2
    assert figures["sharded muon: collectives/step, torch.optim.Muon"] > 2

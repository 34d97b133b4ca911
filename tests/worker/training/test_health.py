"""Loss health (worker/training/health.py; options store/training/health.py): the detector's
arithmetic, and real runs with faults planted through the test seam (TEST_FAULTS_ENV): a
poisoned batch that a rewind skips, and a NaN in one rank's gradients that no rank applies."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.support.plans import run_to_end
from tests.support.ranks import tiny_plan, train_losses
from tests.support.stores import folder, posix_store
from trainctl.store.data.shards import write_shard
from trainctl.store.db.runs import RunStore
from trainctl.store.kinds.train import TrainPlan, TrainRequest, resolve_train
from trainctl.store.training.health import HealthSpec
from trainctl.store.worker_settings import WorkerSettings
from trainctl.worker.launch import launch_train
from trainctl.worker.runner import Worker
from trainctl.worker.training.health import (
    TEST_FAULTS_ENV,
    LossHealth,
    SpikeDetector,
    lower_lrs,
    planted_faults,
)
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import Trainer

# --- the detector ------------------------------------------------------------------------------


def test_the_detector_judges_nothing_while_it_warms_up() -> None:
    detector = SpikeDetector(decay=0.5, warmup=3, threshold=3.0)
    for loss in (5.0, 50.0, 5.0):
        assert detector.score(loss) is None
        detector.learn(loss)
    assert detector.score(5.0) is not None


def test_a_spike_is_a_rise_of_more_than_the_threshold_and_is_never_learned() -> None:
    health = LossHealth(HealthSpec(spike={"warmup_steps": 4, "ema_decay": 0.5, "z_threshold": 3}))
    window = (0, 2)
    for step, loss in enumerate((4.0, 3.9, 4.1, 4.0, 3.95), start=1):
        assert health.judge(step, loss, 1.0, True, window) is None
    before = health.detector.state_dict()

    spike = health.judge(6, 9.0, 1.0, True, window)
    drop = health.judge(7, 1.0, 1.0, True, window)  # good news is no spike

    assert spike is not None and spike.action == "rewind" and spike.reason == "spike"
    assert spike.statistic is not None and spike.statistic > 3
    assert drop is None
    assert before["count"] + 1 == health.detector.count  # the drop was learned, the spike not


def test_a_flat_loss_reads_its_noise_against_a_percent_of_the_mean() -> None:
    detector = SpikeDetector(decay=0.9, warmup=1, threshold=6.0)
    for _ in range(50):
        detector.learn(3.0)
    assert detector.var == 0.0
    z = detector.score(3.03)  # 1 % above: one "standard deviation", no spike
    assert z == pytest.approx(1.0) and not detector.is_spike(z)
    assert detector.is_spike(detector.score(3.3))


def test_non_finite_steps_are_skipped_until_too_many_in_a_row_then_fail() -> None:
    health = LossHealth(HealthSpec(max_skips_in_a_row=2))
    nan = math.nan
    actions = [health.judge(s, nan, nan, False, (0, 1)) for s in (1, 2, 3)]
    assert [a.action if a else None for a in actions] == ["skip", "skip", "fail"]
    assert "3 steps in a row skipped up to step 3" in health.failure(actions[-1])  # type: ignore[arg-type]


def test_the_rewind_cap_fails_the_next_spike_naming_the_steps_rewound_from() -> None:
    health = LossHealth(HealthSpec(spike={"warmup_steps": 1}, rewind={"max_rewinds": 1}))
    health.judge(1, 4.0, 1.0, True, (0, 1))
    first = health.judge(2, 90.0, 1.0, True, (1, 2))
    assert first is not None and first.action == "rewind"
    health.rewound(first, 1)
    again = health.judge(2, 90.0, 1.0, True, (2, 3))
    assert again is not None and again.action == "fail"
    assert "after 1 rewinds (from steps [2])" in health.failure(again)


def test_a_rewind_lowers_the_lr_for_its_steps_and_the_schedule_takes_it_back() -> None:
    health = LossHealth(HealthSpec(spike={"warmup_steps": 1},
                                   rewind={"lr_factor": 0.25, "lr_steps": 2}))  # fmt: skip
    health.judge(1, 4.0, 1.0, True, (0, 1))
    spike = health.judge(9, 90.0, 1.0, True, (8, 9))
    assert spike is not None
    health.rewound(spike, 6)
    assert [health.lr_factor(s) for s in (7, 8, 9)] == [0.25, 0.25, 1.0]

    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    lower_lrs({"sgd": optimizer}, 0.25)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.025)
    assert health.state_dict()["low_lr_until"] == 8  # a resume lowers the same steps


# --- real runs -----------------------------------------------------------------------------------

# A periodic token pattern the tiny model learns at once; the poisoned step is step 8, whose
# micro-batches are data positions 14 and 15 (two per step).
POISONED = [14, 15]
WINDOW = [14, 16]
STEPS = 10
HEALTH = {
    "spike": {"warmup_steps": 4, "ema_decay": 0.5, "z_threshold": 3.0},
    "rewind": {"min_steps_back": 2},  # from step 8: step_6, the newest at or before step 6
}


@pytest.fixture
def plant(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[dict[str, Any]], None]]:
    """Plant faults in this process and the ranks it launches (TEST_FAULTS_ENV)."""

    def faults(planted: dict[str, Any]) -> None:
        monkeypatch.setenv(TEST_FAULTS_ENV, json.dumps(planted))
        planted_faults.cache_clear()

    yield faults
    planted_faults.cache_clear()


def pattern_plan(root: Path, checkpoints: Path | None = None, **changes: Any) -> TrainPlan:
    if not (root / "train.bin").exists():
        root.mkdir()
        write_shard(root / "train.bin", np.tile(np.arange(16), 4000))
        write_shard(root / "val.bin", np.tile(np.arange(16), 100))
    request = {
        "experiment": "spiky",
        "steps": STEPS,
        "log_every": 1,
        "checkpoint_every": 3,
        "val_every": STEPS,
        "val_batches": 1,
        "model": {"preset": "tiny"},
        "data": {"source": "shards", "paths": [str(root / "train.bin")],
                 "val_paths": [str(root / "val.bin")]},
        "batch": {"micro_batch_size": 2, "seq_len": 16, "grad_accum_steps": 2},
        "health": HEALTH,
    } | changes  # fmt: skip
    store = posix_store(checkpoints) if checkpoints is not None else None
    return resolve_train(
        TrainRequest(**request), cuda_available=False, data_roots=[root], checkpoints=store
    )


def last_per_step(metrics: list[dict[str, Any]]) -> list[float]:
    """The loss of each step as the run ended with it: a rewind trains some steps again."""
    losses = {m["step"]: m["loss"] for m in metrics if m["kind"] == "train"}
    return [losses[s] for s in sorted(losses)]


@pytest.mark.slow
def test_a_rewind_skips_the_poisoned_window_and_ends_as_if_the_data_never_held_it(
    runs: RunStore, worker: Worker, tmp_path: Path, plant: Callable[[dict[str, Any]], None]
) -> None:
    data, checkpoints = tmp_path / "data", tmp_path / "checkpoints"
    plant({"poison": POISONED})
    run = run_to_end(runs, worker, pattern_plan(data))
    assert run.state == "succeeded", run.error
    metrics = [e.data for e in runs.events(run.id, type="metrics")]
    (line,) = [e.data for e in runs.events(run.id, type="log") if "health" in e.data]

    plant({"drop": WINDOW})  # the same data without the window
    clean: list[dict[str, Any]] = []
    Trainer(
        pattern_plan(data), posix_store(tmp_path / "clean"), hooks=TrainerHooks(clean.append)
    ).run()

    print(f"rewound: {[m['loss'] for m in metrics if m['kind'] == 'train']}")
    print(f"clean:   {train_losses(clean)}")
    health = line["health"]
    assert line["level"] == "warning" and "rewound to step 6" in line["message"]
    assert (health["step"], health["action"], health["reason"]) == (8, "rewind", "spike")
    assert (health["window"], health["rewound_to"]) == (WINDOW, 6)
    assert health["statistic"] > HEALTH["spike"]["z_threshold"]  # type: ignore[index]
    assert run.result is not None
    assert run.result["health"] == {"interventions": {"rewind": 1}, "rewinds_from": [8]}
    assert [m["step"] for m in metrics if m["kind"] == "train"] == [*range(1, 8), *range(7, 11)]
    assert last_per_step(metrics) == train_losses(clean)  # bit for bit

    # The rewind saved step_6 again, with the window in its data position: a resume from it
    # skips the window too, without a spike to see, and trains the same steps.
    meta = json.loads((folder(posix_store(checkpoints), "spiky", "step_6") / "metadata.json")
                      .read_text())  # fmt: skip
    assert meta["skipped_windows"] == [WINDOW]
    plant({"poison": POISONED})
    resumed: list[dict[str, Any]] = []
    interventions: list[dict[str, Any]] = []
    result = Trainer(
        pattern_plan(data, checkpoints, resume_from="step_6"),
        posix_store(checkpoints),
        hooks=TrainerHooks(on_metrics=resumed.append, on_health=interventions.append),
    ).run()
    assert interventions == []
    assert train_losses(resumed) == train_losses(clean)[6:]
    assert result["health"]["rewinds_from"] == [8]  # the run's record carries over


@pytest.mark.slow
def test_a_nan_in_one_ranks_gradients_is_skipped_on_every_rank(
    tmp_path: Path, plant: Callable[[dict[str, Any]], None]
) -> None:
    plant({"nan_grad": [1, 4]})  # rank 1, step 4: after DDP's average, so rank 0's is finite

    result = launch_train(tiny_plan(nproc_per_node=2), WorkerSettings(data_dir=tmp_path), ctx=None)
    assert result is not None

    # Had rank 1 applied it, its weights would be NaN and so every later step's averaged
    # loss: one skip, and finite losses after it, say that no rank stepped on it.
    assert result["health"] == {"interventions": {"skip": 1}, "rewinds_from": []}
    losses = train_losses(result["metrics"])
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    store = posix_store(tmp_path / "checkpoints")
    weights = load_file(str(folder(store, "ddp", "step_6") / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values())


# make soak: the same rewind on two gloo ranks, which agree on rank 0's checkpoint and reload
# it together; make test's run of one process covers the rewind itself.
@pytest.mark.soak
def test_two_ranks_rewind_together_and_end_as_two_ranks_on_data_without_the_window(
    tmp_path: Path, plant: Callable[[dict[str, Any]], None]
) -> None:
    data = tmp_path / "data"
    ends: dict[str, Any] = {}
    for name, faults in (("rewound", {"poison": POISONED}), ("clean", {"drop": WINDOW})):
        plant(faults)
        plan = pattern_plan(data, nproc_per_node=2)
        ends[name] = launch_train(plan, WorkerSettings(data_dir=tmp_path / name), ctx=None)

    assert ends["rewound"]["health"] == {"interventions": {"rewind": 1}, "rewinds_from": [8]}
    assert last_per_step(ends["rewound"]["metrics"]) == train_losses(ends["clean"]["metrics"])

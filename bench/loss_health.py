"""Issue 44: what loss health (docs/design/health.md, "Loss health") costs a run.

- Step time with the verdict against the same loop without one, in one process, alternated
  round by round on one model: `train_step` with the run's `LossHealth.judge` (defaults: NaN
  skip, spike detection armed, so every step is scored) and with no judge (the path a
  benchmark run takes). Both sides run the same all-reduce of [loss, finite flag] and its one
  read; what differs is the verdict itself.
- Steps lost per rewind: a run with a poisoned batch (the test seam, TRAINCTL_TEST_FAULTS)
  that rewinds, against the same run on data without the window: the steps it trained again,
  and the wall time it took beyond the clean run's.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import Figure, alternate, median, paired_ratio
from trainctl.store.checkpoints.posix import PosixStorage
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.shards import write_shard
from trainctl.store.kinds.train import TrainRequest, resolve_train
from trainctl.store.training.health import HealthSpec
from trainctl.worker.data.loader import SyntheticSampler
from trainctl.worker.training import health
from trainctl.worker.training.health import TEST_FAULTS_ENV, LossHealth
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import Trainer, build_training, data_loader, train_step

# The `tiny` model: a step of milliseconds on two cores, where a per-step cost of
# microseconds shows most (a larger model only hides it); many short rounds, since the
# machine's other tenants make any one round noisy.
FULL: dict[str, Any] = dict(preset="tiny", n_layers=2, batch=4, seq=64, steps=20, rounds=15)
QUICK: dict[str, Any] = dict(preset="tiny", n_layers=2, batch=2, seq=32, steps=3, rounds=2)


def step_sides(size: dict[str, Any]) -> dict[str, Any]:
    """Two sides over one model: a step with the verdict, and without."""
    request = TrainRequest(
        steps=1_000_000,
        model={"preset": size["preset"], "overrides": {"n_layers": size["n_layers"]}},
        data={"source": "synthetic"},
        batch={"micro_batch_size": size["batch"], "seq_len": size["seq"], "grad_accum_steps": 1},
    )
    plan = resolve_train(request, cuda_available=False, data_roots=[])
    vocab = plan.model.config.vocab_size
    sampler = SyntheticSampler(size["batch"], size["seq"], vocab, seed=0)
    parts = build_training(plan, sampler, [], total_steps=plan.steps)
    loader = data_loader(parts, 0)
    judge = LossHealth(HealthSpec(spike={"warmup_steps": 1}))  # armed from the second step
    step = [0]

    def side(with_health: bool) -> float:
        started = time.perf_counter()
        for _ in range(size["steps"]):
            window = (step[0], step[0] + 1)
            verdict = partial(judge.judge, step[0] + 1, window=window) if with_health else None
            train_step(parts, loader, step[0], judge=verdict)
            step[0] += 1
        return (time.perf_counter() - started) / size["steps"]

    return {"health": partial(side, True), "off": partial(side, False), "loader": loader}


def verdict_seconds(calls: int) -> float:
    """The verdict alone, per call: a healthy step's `judge` with the detector armed."""
    judge = LossHealth(HealthSpec(spike={"warmup_steps": 1}))
    losses = 3.0 + 0.01 * np.sin(np.arange(calls))  # healthy noise: no spike, all learned
    started = time.perf_counter()
    for i, loss in enumerate(losses.tolist()):
        judge.judge(i + 1, loss, 1.0, True, (i, i + 1))
    return (time.perf_counter() - started) / calls


def rewind_run(root: Path, faults: dict[str, Any]) -> tuple[float, int, list[dict[str, Any]]]:
    """A run of the periodic pattern with `faults` planted: its wall time, the steps it trained
    and its interventions."""
    os.environ[TEST_FAULTS_ENV] = json.dumps(faults)
    health.planted_faults.cache_clear()
    request = TrainRequest(
        experiment="spiky",
        steps=20,
        log_every=1,
        checkpoint_every=5,
        val_every=20,
        val_batches=1,
        model={"preset": "tiny"},
        data={"source": "shards", "paths": [str(root / "train.bin")],
              "val_paths": [str(root / "val.bin")]},
        batch={"micro_batch_size": 2, "seq_len": 16, "grad_accum_steps": 2},
        health={"spike": {"warmup_steps": 4, "ema_decay": 0.5, "z_threshold": 3.0},
                "rewind": {"min_steps_back": 2}},
    )  # fmt: skip
    plan = resolve_train(request, cuda_available=False, data_roots=[root])
    metrics: list[dict[str, Any]] = []
    found: list[dict[str, Any]] = []
    store = CheckpointStore(PosixStorage(root / f"checkpoints-{time.monotonic_ns()}"))
    started = time.perf_counter()
    hooks = TrainerHooks(on_metrics=metrics.append, on_health=found.append)
    Trainer(plan, store, hooks=hooks).run()
    trained = sum(1 for m in metrics if m["kind"] == "train") + len(found)
    return time.perf_counter() - started, trained, found


def rewind_figures() -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_shard(root / "train.bin", np.tile(np.arange(16), 4000))
        write_shard(root / "val.bin", np.tile(np.arange(16), 100))
        try:
            # The spike at step 13 (positions 24, 25): step_10 is the newest at or before 11.
            rewound, trained, found = rewind_run(root, {"poison": [24, 25]})
            clean, clean_trained, _ = rewind_run(root, {"drop": [24, 26]})
        finally:
            os.environ.pop(TEST_FAULTS_ENV, None)
            health.planted_faults.cache_clear()
    (spike,) = found
    note = (
        f"tiny, 20 steps, checkpoint_every 5, min_steps_back 2: spike at step {spike['step']}, "
        f"rewound to {spike['rewound_to']}"
    )
    return [
        Figure("loss health: steps trained again per rewind", trained - clean_trained, "steps",
               note=note),
        Figure("loss health: wall time of a rewind beyond the clean run", rewound - clean, "s",
               note="the steps trained again, the reload and the save of the checkpoint"),
    ]  # fmt: skip


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    sides = step_sides(size)
    loader = sides.pop("loader")
    try:
        times = alternate(sides, size["rounds"], warmup=True)
    finally:
        loader.close()
    note = (
        f"{size['preset']} dims, {size['n_layers']} layers, B={size['batch']} T={size['seq']}, "
        f"{torch.get_num_threads()} threads, {size['rounds']} alternated rounds of "
        f"{size['steps']} steps"
    )
    return [
        Figure("loss health: step, with the verdict", median(times["health"]) * 1e3, "ms",
               note=note),
        Figure("loss health: step, without", median(times["off"]) * 1e3, "ms"),
        Figure("loss health: step time, with / without", paired_ratio(times["health"],
               times["off"]), "x", target=1.01, lower_is_better=True),
        Figure("loss health: the verdict alone, per step", verdict_seconds(100_000) * 1e6, "us",
               note="LossHealth.judge of a healthy step, the detector armed"),
        *rewind_figures(),
    ]  # fmt: skip

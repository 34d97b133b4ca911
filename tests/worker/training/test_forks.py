"""Forks (docs/design/forks.md, "Forks"): a run started from another experiment's checkpoint
continues its weights, optimizers, data position and RNG, with a schedule of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.support.plans import enqueue, train_plan
from tests.support.polling import poll
from tests.support.stores import folder, posix_store
from tests.support.train_script import run_script
from trainctl.store.checkpoints.manifests import MODEL_FILE, OPTIMIZER_FILE
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.plans import CheckpointRef
from trainctl.store.vocabulary import TERMINAL_STATES
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import Trainer

REPO = Path(__file__).resolve().parents[3]
TINY: dict[str, Any] = {
    "model": {"preset": "tiny"},
    "data": {"source": "synthetic"},
    "batch": {"micro_batch_size": 2, "seq_len": 32, "grad_accum_steps": 2},
    "val_batches": 1,
}


@pytest.mark.slow
def test_a_fork_without_changes_reproduces_its_parents_later_steps_bit_for_bit(
    tmp_path: Path,
) -> None:
    common = TINY | {"steps": 8, "checkpoint_every": 4}
    parent = run_script(train_plan(experiment="parent", **common), tmp_path)
    fork_plan = train_plan(tmp_path, experiment="fork", fork_from="parent/step_4", **common)
    assert fork_plan.fork_from is not None and fork_plan.fork_from.step == 4

    fork = run_script(fork_plan, tmp_path)  # a fresh process, as a worker's

    assert [r["step"] for r in fork] == [5, 6, 7, 8]
    assert [r["loss"] for r in fork] == [r["loss"] for r in parent[4:]]
    store = posix_store(tmp_path)
    a, b = (folder(store, exp, "step_8") for exp in ("parent", "fork"))
    wa, wb = load_file(str(a / MODEL_FILE)), load_file(str(b / MODEL_FILE))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    oa = torch.load(a / OPTIMIZER_FILE, weights_only=True)
    ob = torch.load(b / OPTIMIZER_FILE, weights_only=True)
    assert list(oa) == list(ob) == ["muon", "adamw"]
    for name in oa:
        for key, state in oa[name]["state"].items():
            other = ob[name]["state"][key]
            assert all(torch.equal(t, other[k]) for k, t in state.items() if torch.is_tensor(t))


# The fork's factor at each global step (0-based: the step-th update), by hand: stable until
# decay_start 6, then 1-sqrt over 4 steps to min 0.1 (Hägele et al., 2024):
# min + (1 - min) * (1 - sqrt(t / 4)), t = step - 6; held at min from step 10.
COOLDOWN = {"decay_start": 6, "decay_steps": 4, "decay": "sqrt", "min_lr_ratio": 0.1}
FACTORS = {
    4: 1.0,
    5: 1.0,
    6: 1.0,
    7: 0.55,  # 0.1 + 0.9 * (1 - 0.5)
    8: 0.363603896932107,  # 0.1 + 0.9 * (1 - 0.7071067811865476)
    9: 0.22057713659400524,  # 0.1 + 0.9 * (1 - 0.8660254037844386)
    10: 0.1,
    11: 0.1,
}


def lrs_by_step(metrics: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    return {m["step"] - 1: (m["lr/muon"], m["lr/adamw"]) for m in metrics if m["kind"] == "train"}


def run_worker(data_dir: Path, runs: RunStore, run: Run) -> Run:
    """A worker process serves the queue until `run` is finished."""
    args = [sys.executable, "-m", "trainctl.worker", "--data-dir", str(data_dir)]
    proc = subprocess.Popen(
        [*args, "--heartbeat-seconds", "0.5", "--poll-seconds", "0.1"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
    )
    try:
        done = poll(
            lambda: (r := runs.get(run.id)).state in TERMINAL_STATES and r,
            what="the fork to finish",
        )
    finally:
        proc.kill()
        proc.wait()
    assert isinstance(done, Run)
    return done


@pytest.mark.slow
def test_a_forks_cooldown_follows_the_analytic_lr_at_every_step_and_across_a_requeue(
    tmp_path: Path,
) -> None:
    store = posix_store(tmp_path / "checkpoints")
    constant = {"warmup_frac": 0.0, "stable_frac": 1.0}
    stable = train_plan(experiment="stable", steps=4, checkpoint_every=4, schedule=constant, **TINY)
    Trainer(stable, store).run()
    plan = train_plan(
        tmp_path / "checkpoints",
        experiment="cool",
        fork_from="stable/step_4",
        steps=12,
        checkpoint_every=4,
        schedule=COOLDOWN,
        **TINY,
    )
    with RunStore(f"sqlite:///{tmp_path / 'trainctl.db'}") as runs:
        runs.create_all()
        run = enqueue(runs, plan)
        assert ("stable", "step_4") in runs.protected_checkpoints()

        done = run_worker(tmp_path, runs, run)

        assert done.state == "succeeded", done.error
        logs = [e.data["message"] for e in runs.events(run.id, type="log")]
        assert "forking from checkpoint stable/step_4 (step 4)" in logs
        metrics = [e.data for e in runs.events(run.id, type="metrics")]
        assert ("stable", "step_4") not in runs.protected_checkpoints()

    got = lrs_by_step(metrics)
    assert sorted(got) == sorted(FACTORS)
    for step, factor in FACTORS.items():
        assert got[step] == pytest.approx((0.02 * factor, 3e-4 * factor), rel=1e-12, abs=0)

    # A requeued attempt resumes from the fork's own checkpoint (the executor's resume_from),
    # with the fork's schedule, not the parent's. (Its losses are the worker's only with the
    # same thread count: the worker's bit-exact resume is test_train.py's.)
    own = CheckpointRef(experiment="cool", tag="step_8")
    assert store.get("cool", "step_8").run_id == run.id
    again: list[dict[str, Any]] = []
    Trainer(
        plan.model_copy(update={"resume_from": own}),
        store,
        hooks=TrainerHooks(on_metrics=again.append),
    ).run()
    assert lrs_by_step(again) == {s: got[s] for s in (8, 9, 10, 11)}


@pytest.mark.soak  # 67-80 s of training (900 steps) for a quality claim: under make soak
# since make test neared its 25 minutes; the two tests above check the fork's mechanics there
def test_a_20_percent_sqrt_cooldown_from_a_stable_checkpoint_beats_the_stable_lr(
    tmp_path: Path,
) -> None:
    """WSD's claim, on the CPU: trained at its stable learning rate for 600 steps, the `tiny`
    model forked into a 1-sqrt cooldown to zero over 150 more (20 % of 750) reaches a lower
    validation loss than the same 150 steps continued at the stable rate. Both forks see the
    same batches and validate on the same ones, so the comparison is paired. Measured when
    written (data seeds 0 and 1): 1.661 against 1.724, and 1.672 against 1.733; at 100 + 25
    steps the cooldown still loses (the loss falls fast at full rate that early)."""
    store = posix_store(tmp_path)
    common: dict[str, Any] = {
        "model": {"preset": "tiny"},
        "data": {"source": "stdlib", "max_bytes": 1 << 20},
        "batch": {"micro_batch_size": 8, "seq_len": 64, "grad_accum_steps": 1},
        "val_batches": 8,
    }
    stable = {"warmup_frac": 0.05, "stable_frac": 0.95}  # no decay before step 600
    Trainer(
        train_plan(experiment="stable", steps=600, checkpoint_every=600, schedule=stable, **common),
        store,
    ).run()
    schedules = {
        "cool": {"decay_start": 600, "decay_steps": 150, "decay": "sqrt", "min_lr_ratio": 0.0},
        "flat": {"warmup_frac": 0.0, "stable_frac": 1.0},
    }
    val_loss = {}
    for name, schedule in schedules.items():
        metrics: list[dict[str, Any]] = []
        fork = train_plan(
            tmp_path,
            experiment=name,
            fork_from="stable/step_600",
            steps=750,
            checkpoint_every=750,
            val_every=750,
            schedule=schedule,
            **common,
        )
        Trainer(fork, store, hooks=TrainerHooks(on_metrics=metrics.append)).run()
        val_loss[name] = [m for m in metrics if "val_loss" in m][-1]["val_loss"]
    print(f"\nvalidation loss at step 750: {val_loss}")
    assert val_loss["cool"] < val_loss["flat"] - 0.02

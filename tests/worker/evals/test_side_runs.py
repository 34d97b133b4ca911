"""A train run's evaluations, queued by its worker as its checkpoints commit (docs/evals.md,
"Evaluations during training"): the real executor trains a `tiny` model on a run store and a
checkpoint store, and each checkpoint `evals.every` asks for gets one evaluate run, queued
below the train run's priority and pinned before the run's own retention could delete it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.plans import enqueue, train_plan
from trainctl.store.checkpoints.factory import open_stores
from trainctl.store.db.runs import RunStore
from trainctl.store.evals.side_runs import side_priority
from trainctl.store.layout import DataLayout
from trainctl.store.names import parse_step
from trainctl.store.specs import MAX_PRIORITY, TrainEvals
from trainctl.worker.context import RunContext
from trainctl.worker.executor import WorkerEnv
from trainctl.worker.kinds.train import execute_train

WORKER = "worker-1"


def train(runs: RunStore, tmp_path: Path, **request: Any) -> tuple[str, dict[str, Any], WorkerEnv]:
    """Train a `tiny` model for 4 steps, a checkpoint a step, keeping one: the run's id, its
    result and the worker's stores."""
    plan = train_plan(
        experiment="lm", steps=4, checkpoint_every=1, val_every=4, val_batches=1, max_keep=1,
        model={"preset": "tiny"}, batch={"micro_batch_size": 2, "seq_len": 32}, **request,
    )  # fmt: skip
    enqueue(runs, plan, priority=5)
    run = runs.claim(WORKER, lease_seconds=60)
    assert run is not None
    env = WorkerEnv(open_stores(DataLayout(tmp_path), runs))
    ctx = RunContext(run, runs, WORKER, threading.Event(), lease_seconds=60)
    outcome = execute_train(ctx, env)
    assert outcome.state == "succeeded", outcome.reason
    assert outcome.result is not None
    return run.id, outcome.result, env


def step_tags(env: WorkerEnv) -> list[str]:
    return sorted(
        c.tag
        for c in env.stores.checkpoints.list_checkpoints("lm")
        if parse_step(c.tag) is not None
    )


@pytest.mark.parametrize("async_checkpoint", [False, True])
def test_each_checkpoint_asked_for_gets_an_evaluate_run_that_pins_it_against_retention(
    runs: RunStore, tmp_path: Path, async_checkpoint: bool
) -> None:
    evals = {"tasks": ["arc_easy"], "limit": 4, "every": 2}
    train_id, result, env = train(runs, tmp_path, evals=evals, async_checkpoint=async_checkpoint)

    queued = [runs.get(run_id) for run_id in result["evaluate_runs"]]
    assert [run.depends_on for run in queued] == [[("lm", "step_2")], [("lm", "step_4")]]
    for run in queued:
        assert (run.kind, run.experiment, run.state, run.priority) == (
            "evaluate", "lm", "queued", 4,
        )  # fmt: skip
        assert (run.spec["tasks"], run.spec["limit"], run.spec["device"]) == (
            ["arc_easy"], 4, "cpu",
        )  # fmt: skip
        assert run.spec["tokenizer"]["kind"] == "bytes"
    # max_keep 1 deleted step_1 and step_3; step_2 waits for its evaluation.
    assert step_tags(env) == ["step_2", "step_4"]
    logged = [e.data["message"] for e in runs.events(train_id) if e.type == "log"]
    for run in queued:
        tag = run.depends_on[0][1]
        assert f"queued evaluate run {run.short_id} for {tag}" in logged


def test_a_run_without_evals_queues_nothing(runs: RunStore, tmp_path: Path) -> None:
    train_id, result, env = train(runs, tmp_path)

    assert "evaluate_runs" not in result
    assert [r.id for r in runs.list_runs()[0]] == [train_id]
    assert step_tags(env) == ["step_4"]


@pytest.mark.parametrize(
    ("every", "due"),
    [
        ("checkpoint", [1, 2, 3, 4, 5, 8, 10]),
        (2, [2, 4, 8, 10]),
        (5, [5, 10]),
        (4, [4, 8, 10]),  # the last step too
        (10, [10]),
    ],
)
def test_every_k_steps_evaluates_the_multiples_of_k_and_the_last_step(
    every: str | int, due: list[int]
) -> None:
    evals = TrainEvals(tasks=["arc_easy"], every=every)
    steps = [1, 2, 3, 4, 5, 8, 10]

    assert [s for s in steps if evals.due(s, 10)] == due


def test_a_side_run_goes_after_its_train_run() -> None:
    assert [side_priority(p) for p in (0, 5, -MAX_PRIORITY)] == [-1, 4, -MAX_PRIORITY]

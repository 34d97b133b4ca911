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
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.db.submissions import QueueLimits
from trainctl.store.evals.side_runs import side_priority
from trainctl.store.layout import DataLayout
from trainctl.store.names import parse_step
from trainctl.store.specs import MAX_PRIORITY, TrainEvals
from trainctl.store.worker_settings import WorkerSettings
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


LIMITS = QueueLimits(total=4, per_submitter=2)


def train_within(runs: RunStore, tmp_path: Path, steps: int) -> tuple[str, dict[str, Any]]:
    """alice's train run of `steps` steps, evaluating every checkpoint (one a step), on a
    worker given the queue's limits LIMITS; no worker takes the evaluate runs meanwhile."""
    plan = train_plan(
        experiment="lm", steps=steps, checkpoint_every=1, val_every=steps, val_batches=1,
        max_keep=1, model={"preset": "tiny"}, batch={"micro_batch_size": 2, "seq_len": 32},
        evals={"tasks": ["arc_easy"], "limit": 4},
    )  # fmt: skip
    enqueue(runs, plan, submitted_by="alice")
    run = runs.claim(WORKER, lease_seconds=60)
    assert run is not None
    settings = WorkerSettings(
        data_dir=tmp_path,
        max_queued_runs=LIMITS.total,
        max_queued_runs_per_token=LIMITS.per_submitter,
    )
    env = WorkerEnv(open_stores(DataLayout(tmp_path), runs), settings=settings)
    ctx = RunContext(run, runs, WORKER, threading.Event(), lease_seconds=60)
    outcome = execute_train(ctx, env)
    assert outcome.state == "succeeded", outcome.reason
    assert outcome.result is not None
    return run.id, outcome.result


def queued(runs: RunStore, submitted_by: str | None = None) -> list[Run]:
    return runs.list_runs(state="queued", submitted_by=submitted_by, limit=1000)[0]


def test_evaluations_of_every_checkpoint_keep_within_the_token_s_cap_and_leave_room_for_others(
    runs: RunStore, tmp_path: Path
) -> None:
    train_id, result = train_within(runs, tmp_path, steps=8)

    # alice's cap is 2: the evaluations of the two newest checkpoints wait, the older ones
    # were superseded as newer checkpoints came.
    waiting = queued(runs, "alice")
    assert sorted(r.depends_on[0][1] for r in waiting) == ["step_7", "step_8"]
    assert LIMITS.total is not None and len(queued(runs)) <= LIMITS.total
    superseded = [runs.get(i) for i in result["evaluate_runs"] if i not in {r.id for r in waiting}]
    assert len(superseded) == 6 and all(r.state == "cancelled" for r in superseded)
    for r in superseded:
        assert (
            "superseded by the evaluation of step_"
            in runs.events(r.id, type="state")[-1].data["reason"]
        )
    logged = [e.data["message"] for e in runs.events(train_id) if e.type == "log"]
    assert sum("superseded by the one of step_" in m for m in logged) == 6
    # Another token submits as ever.
    other = train_plan(experiment="other", steps=1)
    assert enqueue(runs, other, submitted_by="bob", queue_limits=LIMITS).state == "queued"


def test_a_token_at_its_cap_gets_no_side_run_and_a_warning_instead(
    runs: RunStore, tmp_path: Path
) -> None:
    for name in ("a", "b"):  # alice's own queue is full before her train run checkpoints
        enqueue(runs, train_plan(experiment=name, steps=1), submitted_by="alice", priority=-1)

    train_id, result = train_within(runs, tmp_path, steps=3)

    assert result["evaluate_runs"] == []
    assert len(queued(runs, "alice")) == 2
    logged = [e.data["message"] for e in runs.events(train_id) if e.type == "log"]
    assert sum("no evaluate run queued for step_" in m and "runs queued" in m for m in logged) == 3
    bob = enqueue(
        runs, train_plan(experiment="c", steps=1), submitted_by="bob", queue_limits=LIMITS
    )
    assert bob.state == "queued"

"""Multi-process train runs (worker/launch.py, worker/training/ranks.py, worker/training/
parallel.py) on CPU: torchrun, two gloo ranks, DDP.

Two ranks on the same global batch follow the single-process run: the losses agree to
LOSS_RTOL. They differ only by float rounding: the ranks sum the gradient halves in another
order than one process accumulating them, and Muon's Newton-Schulz iteration (bfloat16)
carries such differences into the following steps.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

from tests.support.plans import run_to_end, train_plan
from tests.support.ranks import LOSS_RTOL, STEPS, tiny_plan, train_losses
from tests.support.stores import folder, posix_store
from trainctl.store.db.runs import RunStore
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.worker_settings import WorkerSettings
from trainctl.worker.context import RunContext
from trainctl.worker.executor import stopped_outcome
from trainctl.worker.launch import check_world, launch_train
from trainctl.worker.runner import Worker
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import Trainer
from trainctl.worker.training.parallel import STOP_CODES, RankSampler
from trainctl.worker.training.ranks import grow_watch


def test_the_ranks_together_read_exactly_the_batches_of_one_process() -> None:
    class Positions:
        def batch(self, position: int) -> Any:
            return position

    def first(sampler: RankSampler, n: int) -> list[Any]:
        it = sampler.iterate(start=8)
        return [next(it) for _ in range(n)]

    shares = [first(RankSampler(Positions(), rank, 2), 4) for rank in (0, 1)]  # type: ignore[arg-type]

    assert shares == [[8, 10, 12, 14], [9, 11, 13, 15]]


def test_grad_accum_steps_must_split_evenly_across_the_processes() -> None:
    with pytest.raises(InvalidRequest, match=r"grad_accum_steps 3 .* nproc_per_node 2"):
        train_plan(steps=1, batch={"grad_accum_steps": 3}, nproc_per_node=2)
    default = train_plan(steps=1, nproc_per_node=2)
    assert default.batch.grad_accum_steps == 2  # the CPU profile's 1, rounded up


@pytest.mark.slow
def test_two_gloo_ranks_train_like_one_process_on_the_same_global_batch(tmp_path: Path) -> None:
    single: list[dict[str, Any]] = []
    Trainer(
        tiny_plan(), posix_store(tmp_path / "single"), hooks=TrainerHooks(on_metrics=single.append)
    ).run()

    result = launch_train(
        tiny_plan(nproc_per_node=2), WorkerSettings(data_dir=tmp_path / "ddp"), ctx=None
    )

    assert result is not None
    expected, got = train_losses(single), train_losses(result["metrics"])
    print(f"single: {expected}\n2 ranks: {got}")
    assert len(got) == STEPS
    assert got == pytest.approx(expected, rel=LOSS_RTOL)
    assert result["final_val_loss"] == pytest.approx(single[-1]["val_loss"], rel=LOSS_RTOL)
    assert result["token_count"] == STEPS * 4 * 2 * 32  # the global batch, counted once


@pytest.mark.slow
def test_a_two_process_run_reports_once_saves_from_rank_0_and_resumes_exactly(
    runs: RunStore, worker: Worker, tmp_path: Path
) -> None:
    checkpoints = posix_store(tmp_path / "checkpoints")

    straight = run_to_end(runs, worker, tiny_plan(nproc_per_node=2))
    assert straight.state == "succeeded", straight.error
    steps = [e.data["step"] for e in runs.events(straight.id, type="metrics") if "loss" in e.data]
    assert steps == list(range(1, STEPS + 1))  # one report per step: rank 0's
    assert {c.tag for c in checkpoints.list_checkpoints("ddp")} == {"step_3", "step_6", "best"}
    assert {c.run_id for c in checkpoints.list_checkpoints("ddp")} == {straight.id}
    weights = folder(checkpoints, "ddp", "step_6") / "model.safetensors"
    straight_weights = weights.read_bytes()

    checkpoints.delete("ddp", "step_6")
    resumed = run_to_end(
        runs, worker, tiny_plan(tmp_path / "checkpoints", nproc_per_node=2, resume_from="step_3")
    )

    assert resumed.state == "succeeded", resumed.error
    assert resumed.result is not None and straight.result is not None
    assert resumed.result["final_loss"] == straight.result["final_loss"]
    assert weights.read_bytes() == straight_weights  # bit-identical with the same world size


def test_a_gang_member_needs_the_gpus_of_one_node_not_of_the_whole_gang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = train_plan(steps=1, device="cuda", nnodes=2, nproc_per_node=8)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    check_world(plan)  # 16 ranks, 8 on each node
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    with pytest.raises(RuntimeError, match="nproc_per_node=8 GPUs but this worker sees 4"):
        check_world(plan)


@pytest.mark.slow  # torchrun and two ranks: the edit loop leaves it to make test
def test_rank_0_of_a_two_process_run_queues_the_evaluate_runs_of_its_checkpoints(
    runs: RunStore, worker: Worker, tmp_path: Path
) -> None:
    evals = {"tasks": ["arc_easy"], "limit": 4}
    plan = tiny_plan(nproc_per_node=2, data={"source": "stdlib"}, max_keep=1, evals=evals)

    run = run_to_end(runs, worker, plan)

    assert run.state == "succeeded", run.error
    assert run.result is not None
    evaluations = [runs.get(run_id) for run_id in run.result["evaluate_runs"]]
    assert [e.depends_on for e in evaluations] == [[("ddp", "step_3")], [("ddp", "step_6")]]
    assert {e.kind for e in evaluations} == {"evaluate"}
    # max_keep 1: step_3 is kept for its evaluation.
    tags = {c.tag for c in posix_store(tmp_path / "checkpoints").list_checkpoints("ddp")}
    assert tags == {"step_3", "step_6", "best"}


def test_rank_0_of_a_shrunk_gang_grows_back_after_a_commit_and_the_run_is_requeued() -> None:
    """The worker half of growing back (docs/design/placement.md, "Elastic gangs"); the
    store's rule is tests/store/db/test_placement.py's, the whole tests/e2e/test_elastic.py's."""
    asked: list[str] = []
    logged: list[str] = []
    room = [False]

    class Runs:
        def room_to_grow(self, run_id: str, lease_seconds: float) -> bool:
            asked.append(run_id)
            return room[0]

    ctx = SimpleNamespace(
        runs=Runs(), run=SimpleNamespace(id="r1"), lease_seconds=5.0, log=logged.append
    )
    elastic = train_plan(steps=10, nnodes={"min": 2, "max": 3})
    grow = threading.Event()
    after_commit = grow_watch(elastic, cast(RunContext, ctx), grow, None)
    after_commit("step_2", 2)
    assert asked == ["r1"] and not grow.is_set()
    room[0] = True
    after_commit("step_10", 10)  # the last step's checkpoint: not worth a restart
    assert not grow.is_set()
    after_commit("step_4", 4)
    assert grow.is_set() and "growing back after step 4" in logged[-1]
    fixed = grow_watch(
        train_plan(steps=10, nnodes=3), cast(RunContext, ctx), threading.Event(), None
    )
    fixed("step_4", 4)
    assert len(asked) == 2  # a gang of fixed size never asks
    # Grow yields to any other reason; alone, it hands the run back without failing it.
    assert STOP_CODES["grow"] < min(c for r, c in STOP_CODES.items() if r != "grow")
    outcome = stopped_outcome(cast(RunContext, ctx), {"stop_reason": "grow"})
    assert outcome.state == "requeue" and "growing back" in outcome.reason

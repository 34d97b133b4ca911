"""The Trainer's hooks (worker/training/hooks.py): none given tells nobody anything, a rank
other than 0 only agrees on when to stop, and a worker's run gets its hooks from its
RunContext in one call."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checkpoints import make_parts, save_checkpoint
from tests.support.plans import enqueue, train_plan
from tests.support.stores import posix_store
from trainctl.store.db.runs import RunStore
from trainctl.store.exceptions import LeaseLost
from trainctl.worker.context import RunContext
from trainctl.worker.drain import Shutdown
from trainctl.worker.training.hooks import TrainerHooks

WORKER = "worker-1"


def test_hooks_given_none_report_nothing_never_stop_and_protect_nothing() -> None:
    hooks = TrainerHooks()
    hooks.on_metrics({"kind": "train"})  # heard by nobody, and no error
    hooks.on_progress(1, 2)
    assert hooks.should_stop() is False
    assert hooks.protected() == frozenset()
    assert (hooks.before_commit, hooks.after_commit, hooks.drain) == (None, None, None)


def test_a_silent_rank_keeps_only_the_stop_every_rank_must_agree_on() -> None:
    def stop() -> bool:
        return True

    assert TrainerHooks.silent(stop) == TrainerHooks(should_stop=stop)
    assert TrainerHooks.silent().should_stop() is False


def test_the_hooks_of_a_run_report_to_its_store_and_confirm_the_lease_before_a_commit(
    runs: RunStore, tmp_path: Path
) -> None:
    store = posix_store(tmp_path)
    save_checkpoint(*make_parts(), 1, 100, None, tmp_path / "exp")
    enqueue(runs, train_plan(experiment="exp", steps=2))
    run = runs.claim(WORKER, lease_seconds=60)
    assert run is not None
    shutdown = Shutdown(5.0)
    ctx = RunContext(run, runs, WORKER, shutdown, lease_seconds=60)

    def evals(tag: str, step: int) -> None: ...

    hooks = TrainerHooks.of_run(ctx, store, "exp", after_commit=evals)
    hooks.on_metrics({"kind": "train", "step": 1, "total_steps": 2, "loss": 1.0})
    assert [e.data["loss"] for e in runs.events(run.id, type="metrics")] == [1.0]
    assert hooks.before_commit == ctx.confirm_lease and hooks.after_commit is evals
    assert hooks.drain is shutdown and hooks.should_stop() is False
    # The run is active: its experiment's latest checkpoint is where a requeue resumes.
    assert ("exp", "step_1") in hooks.protected()
    shutdown.set()
    assert hooks.should_stop() is True  # the run's own reasons, unless told others

    def agreed() -> bool:
        return False

    assert TrainerHooks.of_run(ctx, store, "exp", should_stop=agreed).should_stop is agreed
    ctx.lease_lost.set()
    with pytest.raises(LeaseLost):  # asked after the commit, only while the run is ours
        hooks.protected()

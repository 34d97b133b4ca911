"""Hangs and stragglers in real two-rank gloo runs (worker.training.hangs, worker.launch):
a rank stopped with SIGSTOP is declared hung within its learned timeout, every rank's stacks
reach the run's events, and the run goes on from its checkpoint in a new attempt; a rank
slowed on purpose is reported as a straggler within its window. The faults come from
TRAINCTL_TEST_RANK_FAULT (`RankFault`), which only these tests set."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.plans import enqueue
from tests.support.ranks import tiny_plan
from trainctl.store.db.runs import RunStore
from trainctl.store.worker_settings import WorkerSettings
from trainctl.worker.launch import launch_train
from trainctl.worker.runner import Worker
from trainctl.worker.training.hangs import FAULT_VARIABLE

# Small enough for a test, large enough that two shared cores under a CI run never miss one
# by slowness alone: a tiny step takes about 0.05 s here.
HANG = {"floor_seconds": 3.0, "multiplier": 10.0, "allowance_seconds": 20.0, "warmup_steps": 2}
GLOO_TIMEOUT_SECONDS = 30 * 60  # torch's default for gloo groups: what a hang would wait for


@pytest.mark.slow
def test_a_stopped_rank_is_declared_hung_its_stacks_logged_and_the_run_resumes(
    runs: RunStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_VARIABLE, "1:stop:3")  # after step 3, whose checkpoint it saved
    url = runs.engine.url.render_as_string()
    settings = WorkerSettings(
        database_url=url, data_dir=tmp_path, worker_id="w1", heartbeat_seconds=0.2
    )
    worker = Worker(settings, runs)
    worker.register()
    run = enqueue(runs, tiny_plan(nproc_per_node=2, hang=HANG))
    started = time.monotonic()

    first = runs.claim("w1", lease_seconds=60)
    assert first is not None
    worker.run_one(first)

    requeued = runs.get(run.id)
    assert requeued.state == "queued", requeued.error
    logs = [e.data for e in runs.events(run.id, type="log")]
    hang = next(d for d in logs if "hang" in d)
    assert hang["hang"]["step"] == 3 and 1 in hang["hang"]["ranks"], hang
    assert hang["hang"]["late_seconds"] < 2.0, hang  # declared one poll after the deadline
    stacks = [d["message"] for d in logs if "Python stacks" in d["message"]]
    assert len(stacks) == 2, logs  # both ranks': the stopped one, and the one waiting on it
    assert all("File " in s and "trainctl" in s for s in stacks), stacks
    assert any("maybe_stop" in s for s in stacks)  # where rank 1 stopped

    second = runs.claim("w1", lease_seconds=60)
    assert second is not None and second.attempt == 2
    worker.run_one(second)

    done = runs.get(run.id)
    assert done.state == "succeeded", done.error
    assert done.result is not None and done.result["step"] == 6
    messages = [e.data["message"] for e in runs.events(run.id, type="log")]
    assert any("resuming from step_3" in m for m in messages)
    assert time.monotonic() - started < GLOO_TIMEOUT_SECONDS / 10


@pytest.mark.slow
def test_a_rank_slowed_on_purpose_is_reported_as_a_straggler_within_its_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_VARIABLE, "1:slow:0.2")
    plan = tiny_plan(nproc_per_node=2, stragglers={"window": 3})

    result = launch_train(plan, WorkerSettings(data_dir=tmp_path), ctx=None)

    assert result is not None
    first = result["stragglers"][0]
    assert first["step"] <= 3  # reported as soon as the window holds three steps
    assert list(first["slowdowns"]) == ["1"] and first["slowdowns"]["1"] > 0.2

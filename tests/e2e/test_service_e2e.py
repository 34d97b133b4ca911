"""The mission, end to end: real service, real worker processes, real HTTP."""

from __future__ import annotations

import hashlib
import os
import signal
import tarfile
from pathlib import Path

import pytest

from tests.e2e.runs import result_of, wait_done, wait_step
from tests.support.service_process import Service
from trainctl.service.sdk.client import TrainctlClient
from trainctl.store.db.runs import RunStore

LONG_TRAIN = {"steps": 100_000, "checkpoint_every": 100_000}
STEPS_ACROSS_RESTART = 150


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# The main flow runs on PostgreSQL too; the other end-to-end tests run on SQLite only: the store
# tests already cover every query on both databases, and each end-to-end test costs tens of
# seconds.
# make test runs it on SQLite; PostgreSQL's end to end is the multi-node tests' (make soak: both).
@pytest.mark.parametrize(
    "service", ["sqlite", pytest.param("postgresql", marks=pytest.mark.soak)], indirect=True
)
def test_benchmark_then_train_then_checkpoints_work_after_one_command(
    service: Service, tmp_path: Path
) -> None:
    service.start()
    with TrainctlClient(service.url) as client:
        bench = client.submit("benchmark", {"steps": 5, "warmup_steps": 1})
        assert bench.state == "queued" and bench.spec["model"]["preset"] == "tiny"
        done = wait_done(client, bench.id)
        assert done.state == "succeeded", done.error
        assert result_of(done)["tokens_per_sec"] > 0 and result_of(done)["warnings"]

        train = {"experiment": "demo", "steps": 55, "checkpoint_every": 11}
        run = client.submit("train", train)
        events = list(client.events(run.id))  # follows the stream until the run ends
        assert [e.data["state"] for e in events if e.type == "state"][-1] == "succeeded"
        steps = [
            e.data["step"] for e in events if e.type == "metrics" and e.data["kind"] == "train"
        ]
        assert steps == [10, 20, 30, 40, 50, 55]  # every log_every (10) steps, and the last
        val_steps = [e.data["step"] for e in events if e.type == "metrics" and "val_loss" in e.data]
        assert val_steps == [11, 22, 33, 44, 55]  # validation is not thinned

        latest = client.latest_checkpoint()
        assert (latest.experiment, latest.tag, latest.step) == ("demo", "step_55", 55)

        val = client.submit("validate", {"checkpoint": "latest", "experiment": "demo"})
        pinned = {"experiment": "demo", "tag": "step_55"}
        assert val.spec["checkpoint"] == pinned  # resolved when submitted
        checked = wait_done(client, val.id)
        assert checked.state == "succeeded", checked.error
        assert result_of(checked)["loss"] < 6.0 and result_of(checked)["n_tokens"] > 0
        entry = next(f for f in latest.files if f.name == "model.safetensors")
        dest = tmp_path / "download" / "model.safetensors"
        dest.parent.mkdir()
        client.download_file("demo", "step_55", "model.safetensors", dest)
        assert sha256(dest) == entry.sha256

        archive = tmp_path / "demo.tar"
        client.download_archive("demo", "step_55", archive)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp_path / "untar", filter="data")
        untarred = tmp_path / "untar" / "step_55"
        for f in latest.files:
            assert sha256(untarred / f.name) == f.sha256

        pruned = client.prune("demo", keep_last=1)
        left = {c.tag for c in client.list_checkpoints("demo")}
        assert left == {"step_55", "best"}
        assert {c.tag for c in pruned.deleted} == {"step_33", "step_44"}


def test_cancel_a_running_train_run_saves_a_checkpoint(service: Service) -> None:
    service.start()
    with TrainctlClient(service.url) as client:
        run = client.submit("train", {"experiment": "cancelme", **LONG_TRAIN})
        wait_step(client, run.id, 3)
        client.cancel_run(run.id)
        done = wait_done(client, run.id)
        assert done.state == "cancelled"
        latest = client.latest_checkpoint("cancelme")
        assert latest.step == result_of(done)["step"] and latest.run_id == run.id


# make soak: two runs through the service, a minute on 2 cores. make test holds its parts:
# tests/worker/test_runner.py kills a worker mid-run and resumes the run from its own
# checkpoint, tests/worker/training/test_train.py resumes bit for bit in a fresh process.
@pytest.mark.soak
def test_kill_9_mid_run_resumes_exactly_like_an_uninterrupted_run(service: Service) -> None:
    """Exact resume through the service. The rule: a run killed mid-flight restarts from
    the newest checkpoint it wrote itself and recomputes the steps after it; weights,
    optimizer state, schedule, RNG and data position all come from that checkpoint, so the
    recomputed steps see the same batches and give the same numbers, bit for bit."""
    service.start()
    # Killed past step 30, the run resumes from its newest checkpoint and recomputes the
    # steps after it, a validation among them: 80 steps show the exact resume as 120 did.
    spec = {"steps": 80, "checkpoint_every": 20, "val_every": 40}
    with TrainctlClient(service.url) as client:
        straight = client.submit("train", {"experiment": "straight", **spec})
        run = client.submit("train", {"experiment": "crash", **spec})
        assert wait_done(client, straight.id).state == "succeeded"
        running = wait_step(client, run.id, 30)
        worker = next(w for w in client.workers() if w.id == running.worker_id)
        os.kill(worker.pid, signal.SIGKILL)
        done = wait_done(client, run.id, timeout=600)
        assert done.state == "succeeded", done.error
        assert done.attempt == 2 and done.worker_id != running.worker_id
        logs = [item.message for item in client.logs(run.id)]
        assert any("attempt 2: resuming from step_" in m for m in logs)

        expected = result_of(client.get_run(straight.id))
        assert result_of(done)["step"] == expected["step"] == 80
        assert result_of(done)["final_loss"] == expected["final_loss"]
        assert result_of(done)["best_loss"] == expected["best_loss"]
        files = [
            {f.name: f.sha256 for f in client.get_checkpoint(exp, "step_80").files}
            for exp in ("straight", "crash")
        ]
        assert files[0]["model.safetensors"] == files[1]["model.safetensors"]  # same weights
        assert files[0]["optimizer.pt"] == files[1]["optimizer.pt"]


def test_restarting_the_service_loses_no_queued_or_running_run(service: Service) -> None:
    """The train run is stopped with the service past step 5 and resumed to its end after the
    restart; 150 steps leave it far from done when the stop lands (400 trained no more of
    what is checked)."""
    service.start(workers=0)  # nothing runs: every submitted run stays queued
    with TrainctlClient(service.url) as client:
        queued = [client.submit("benchmark", {"steps": 2, "warmup_steps": 0}).id for _ in range(3)]
    assert service.stop()

    service.start(workers=1)
    with TrainctlClient(service.url) as client:
        long = client.submit(
            "train",
            {"experiment": "restart", "steps": STEPS_ACROSS_RESTART, "checkpoint_every": 1000},
        )
        for run_id in queued:
            assert wait_done(client, run_id).state == "succeeded"
        wait_step(client, long.id, 5)
    assert service.stop()
    with RunStore(f"sqlite:///{service.data_dir / 'trainctl.db'}") as runs:
        stopped = runs.get(long.id)  # the worker checkpointed it and gave it back
    assert stopped.state == "queued" and 5 <= (stopped.progress["step"] or 0) < STEPS_ACROSS_RESTART

    service.start(workers=1)
    with TrainctlClient(service.url) as client:
        done = wait_done(client, long.id, timeout=600)
        assert done.state == "succeeded", done.error
        assert result_of(done)["step"] == STEPS_ACROSS_RESTART
        assert len(client.list_runs(limit=50).items) == 4

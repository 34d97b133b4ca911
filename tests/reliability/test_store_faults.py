"""A full or unwritable checkpoint store during a save.

The save fails with an error that names the problem, leaves nothing behind (no staging
folder, no half checkpoint) and touches no earlier checkpoint. Through a real worker: the
run ends `failed` with that error and the worker goes on serving.

"Full" is ENOSPC raised from inside the save (in-process by monkeypatching, in the worker
by a sitecustomize that makes fsync fail). "Unwritable" must also stop root, which CI runs
as: chmod 0o555 for other users, the immutable attribute (chattr +i) for root, and where
root may not set it (a container without CAP_LINUX_IMMUTABLE) a regular file in place of
the experiment folder while its checkpoints wait aside.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import safetensors

import worker.checkpoint
from store.checkpoints import CheckpointStore, verify_manifest
from store.runs import Run, RunStore
from store.specs import TrainSpec, resolve_train
from tests.reliability import saver
from worker.checkpoint import load_checkpoint
from worker.exceptions import CheckpointWriteFailed

REPO = Path(__file__).resolve().parents[2]
FAULTS = Path(__file__).with_name("faults")
EXP = saver.EXPERIMENT
TERMINAL = ("succeeded", "failed", "cancelled")


@contextmanager
def unwritable(folder: Path) -> Iterator[str]:
    """Make `folder` refuse new entries by a mechanism that also stops root; yield which."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield "chmod 0o555"
        finally:
            folder.chmod(0o755)
        return
    chattr = shutil.which("chattr")
    if chattr and subprocess.run([chattr, "+i", str(folder)], capture_output=True).returncode == 0:
        try:
            yield "chattr +i"
        finally:
            subprocess.run([chattr, "-i", str(folder)], check=True)
        return
    aside = folder.parent.parent / f"{folder.name}.aside"
    folder.rename(aside)
    folder.write_text("not a folder")
    try:
        yield "a regular file in place of the folder"
    finally:
        folder.unlink()
        aside.rename(folder)


def snapshot(store: CheckpointStore) -> dict[str, str]:
    """Tag -> manifest text: equal snapshots mean no earlier checkpoint was touched."""
    return {c.tag: (c.path / "manifest.json").read_text() for c in store.list(EXP)}


def assert_intact(store: CheckpointStore, before: dict[str, str]) -> None:
    assert snapshot(store) == before
    folder = store.experiment_dir(EXP)
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []
    for info in store.list(EXP):
        verify_manifest(info.path, deep=True)
    load_checkpoint(*saver.build_parts(), store.latest(EXP).path)


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    parts = saver.build_parts()
    for step in (1, 2):
        saver.save_step(parts, tmp_path, step)
    return CheckpointStore(tmp_path)


def fsync_reports_a_full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    def full(path: Path) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(worker.checkpoint, "_fsync", full)


def safetensors_runs_out_of_space(monkeypatch: pytest.MonkeyPatch) -> None:
    def half_written(tensors: object, filename: str, *args: object, **kwargs: object) -> None:
        Path(filename).write_bytes(b"\0" * 4096)
        raise safetensors.SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(worker.checkpoint, "save_file", half_written)


@pytest.mark.parametrize("fault", [fsync_reports_a_full_disk, safetensors_runs_out_of_space])
def test_a_full_store_fails_the_save_clearly_and_leaves_nothing_behind(
    store: CheckpointStore,
    monkeypatch: pytest.MonkeyPatch,
    fault: Callable[[pytest.MonkeyPatch], None],
) -> None:
    before = snapshot(store)
    fault(monkeypatch)
    with pytest.raises(CheckpointWriteFailed, match=r"checkpoint store full.*No space left"):
        saver.save_step(saver.build_parts(), store.root, 3)
    monkeypatch.undo()
    assert_intact(store, before)
    assert store.latest(EXP).tag == "step_2"


def test_an_unwritable_store_fails_the_save_clearly_and_leaves_nothing_behind(
    store: CheckpointStore,
) -> None:
    before = snapshot(store)
    with (
        unwritable(store.experiment_dir(EXP)) as how,
        pytest.raises(CheckpointWriteFailed, match=r"checkpoint store not writable") as failed,
    ):
        saver.save_step(saver.build_parts(), store.root, 3)
    assert f"{EXP}/step_3" in str(failed.value), how
    assert_intact(store, before)


# --- through a real worker process --------------------------------------------------------


def poll(predicate: Callable[[], Any], timeout: float = 120.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def enqueue_train(runs: RunStore, experiment: str, steps: int) -> Run:
    spec = TrainSpec(
        experiment=experiment,
        steps=steps,
        model={"preset": "tiny"},
        data={"source": "synthetic"},
        batch={"micro_batch_size": 2, "seq_len": 32},
        checkpoint_every=2,
        val_every=1000,
        val_batches=1,
    )
    spec = resolve_train(spec, cuda_available=False, data_roots=[])
    return runs.enqueue("train", experiment, spec.model_dump(mode="json"))


def finished(runs: RunStore, run: Run) -> Run:
    return poll(lambda: (r := runs.get(run.id)).state in TERMINAL and r, what=f"run {run.id}")


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[RunStore]:
    store = RunStore(f"sqlite:///{tmp_path / 'trainctl.db'}")
    store.create_all()
    yield store
    store.close()


def test_a_run_whose_store_fails_ends_failed_with_the_reason_and_the_worker_serves_on(
    tmp_path: Path, runs: RunStore
) -> None:
    root, full = tmp_path / "checkpoints", tmp_path / "store-is-full"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(FAULTS), os.environ.get("PYTHONPATH", "")]),
        TRAINCTL_FAULT_UNDER=str(root),
        TRAINCTL_FAULT_STORE_FULL=str(full),
    )
    args = ["--data-dir", str(tmp_path), "--heartbeat-seconds", "0.5", "--poll-seconds", "0.1"]
    with open(tmp_path / "worker.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", *args], cwd=REPO, env=env, stderr=log
        )
    try:
        first = finished(runs, enqueue_train(runs, "e", steps=4))
        assert first.state == "succeeded", first.error
        store = CheckpointStore(root)
        before = {c.tag: (c.path / "manifest.json").read_text() for c in store.list("e")}
        assert before.keys() == {"best", "step_2", "step_4"}

        full.touch()
        on_full = finished(runs, enqueue_train(runs, "e", steps=6))
        full.unlink()
        assert on_full.state == "failed"
        assert "checkpoint store full" in (on_full.error or "")
        assert "No space left on device" in (on_full.error or "")

        with unwritable(store.experiment_dir("e")) as how:
            on_readonly = finished(runs, enqueue_train(runs, "e", steps=6))
        assert on_readonly.state == "failed"
        assert "checkpoint store not writable" in (on_readonly.error or ""), how

        for info in store.list("e"):
            verify_manifest(info.path, deep=True)
        after = {c.tag: (c.path / "manifest.json").read_text() for c in store.list("e")}
        assert after == before, "an earlier checkpoint was touched"
        assert sorted(p.name for p in store.experiment_dir("e").iterdir()) == sorted(before)
        assert proc.poll() is None, "the worker died"
        last = finished(runs, enqueue_train(runs, "e2", steps=2))
        assert last.state == "succeeded", last.error
    finally:
        proc.kill()
        proc.wait()

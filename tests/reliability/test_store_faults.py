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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.reliability import saver
from tests.reliability.workers import Workers, enqueue_tiny_train, wait_finished
from tests.support.stores import folder, posix_store
from trainctl.store.checkpoints.manifests import verify_manifest
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.runs import RunStore
from trainctl.worker.checkpoints.state import load_checkpoint
from trainctl.worker.exceptions import CheckpointWriteFailed

FAULTS = Path(__file__).with_name("faults")
EXP = saver.EXPERIMENT


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


def snapshot(store: CheckpointStore, experiment: str = EXP) -> dict[str, str]:
    """Tag -> manifest text: equal snapshots mean no earlier checkpoint was touched."""
    return {
        c.tag: (folder(store, experiment, c.tag) / "manifest.json").read_text()
        for c in store.list_checkpoints(experiment)
    }


def assert_intact(store: CheckpointStore, before: dict[str, str]) -> None:
    assert snapshot(store) == before
    exp = folder(store, EXP)
    assert [p.name for p in exp.iterdir() if p.name.startswith(".")] == []
    for info in store.list_checkpoints(EXP):
        verify_manifest(store.entry(EXP, info.tag), deep=True)
    load_checkpoint(*saver.build_parts(), store.entry(EXP, store.latest(EXP).tag))


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    parts = saver.build_parts()
    for step in (1, 2):
        saver.save_step(parts, tmp_path, step)
    return posix_store(tmp_path)


def fsync_reports_a_full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every fsync of the save (its files, the manifest, the folders) reports a full disk,
    # wherever in the code it happens: that is how a full disk surfaces with delayed
    # allocation.
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)


def the_disk_fills_while_the_weights_are_written(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first write lands part of its bytes, then the disk is full: a half-written file in
    # the staging folder, as a real ENOSPC leaves it.
    real_write = os.write

    def partly(fd: int, data: Any) -> int:
        real_write(fd, bytes(memoryview(data)[:4096]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", partly)


@pytest.mark.parametrize(
    "fault", [fsync_reports_a_full_disk, the_disk_fills_while_the_weights_are_written]
)
def test_a_full_store_fails_the_save_clearly_and_leaves_nothing_behind(
    store: CheckpointStore,
    monkeypatch: pytest.MonkeyPatch,
    fault: Callable[[pytest.MonkeyPatch], None],
) -> None:
    before = snapshot(store)
    fault(monkeypatch)
    with pytest.raises(CheckpointWriteFailed, match=r"checkpoint store full.*No space left"):
        saver.save_step(saver.build_parts(), folder(store, EXP).parent, 3)
    monkeypatch.undo()
    assert_intact(store, before)
    assert store.latest(EXP).tag == "step_2"


def test_an_unwritable_store_fails_the_save_clearly_and_leaves_nothing_behind(
    store: CheckpointStore,
) -> None:
    before = snapshot(store)
    with (
        unwritable(folder(store, EXP)) as how,
        pytest.raises(CheckpointWriteFailed, match=r"checkpoint store not writable") as failed,
    ):
        saver.save_step(saver.build_parts(), folder(store, EXP).parent, 3)
    assert f"{EXP}/step_3" in str(failed.value), how
    assert_intact(store, before)


# --- through a real worker process --------------------------------------------------------


def test_a_run_whose_store_fails_ends_failed_with_the_reason_and_the_worker_serves_on(
    tmp_path: Path, runs: RunStore, workers: Workers
) -> None:
    root, full = tmp_path / "checkpoints", tmp_path / "store-is-full"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(FAULTS), os.environ.get("PYTHONPATH", "")]),
        TRAINCTL_FAULT_UNDER=str(root),
        TRAINCTL_FAULT_STORE_FULL=str(full),
    )
    proc = workers.start("worker", env)
    first = wait_finished(runs, enqueue_tiny_train(runs, "e", 4, checkpoint_every=2))
    assert first.state == "succeeded", first.error
    store = posix_store(root)
    before = snapshot(store, "e")
    assert before.keys() == {"best", "step_2", "step_4"}

    full.touch()
    on_full = wait_finished(runs, enqueue_tiny_train(runs, "e", 6, checkpoint_every=2))
    full.unlink()
    assert on_full.state == "failed"
    assert "checkpoint store full" in (on_full.error or "")
    assert "No space left on device" in (on_full.error or "")

    with unwritable(folder(store, "e")) as how:
        on_readonly = wait_finished(runs, enqueue_tiny_train(runs, "e", 6, checkpoint_every=2))
    assert on_readonly.state == "failed"
    assert "checkpoint store not writable" in (on_readonly.error or ""), how

    for info in store.list_checkpoints("e"):
        verify_manifest(store.entry("e", info.tag), deep=True)
    assert snapshot(store, "e") == before, "an earlier checkpoint was touched"
    assert sorted(p.name for p in folder(store, "e").iterdir()) == sorted(before)
    assert proc.poll() is None, "the worker died"
    last = wait_finished(runs, enqueue_tiny_train(runs, "e2", 2, checkpoint_every=2))
    assert last.state == "succeeded", last.error

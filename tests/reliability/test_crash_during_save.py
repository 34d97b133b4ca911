"""kill -9 during checkpoint saves: whatever the moment, the store stays consistent.

Every kill is followed by the checks a restarted worker relies on: listings never show a
hidden (staging or trash) folder, `latest` loads into a fresh model and verifies, every other
listed checkpoint verifies, and `CheckpointStore.cleanup` (run at the next start) removes
leftover staging folders and puts back a checkpoint whose replacing commit was interrupted.

TRAINCTL_SOAK_ROUNDS sets the number of random kills (default 20; `make soak` runs hundreds).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.reliability import saver
from tests.support.soak import rounds
from tests.support.stores import folder, posix_store
from trainctl.store.checkpoints.info import CheckpointInfo
from trainctl.store.checkpoints.manifests import verify_manifest
from trainctl.store.checkpoints.posix import STAGING_PREFIX, TRASH_PREFIX
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.names import BEST_TAG, parse_step
from trainctl.worker.checkpoints.state import load_checkpoint

ROUNDS = rounds(20)
SEED = int(os.environ.get("TRAINCTL_SOAK_SEED", "4"))
READY_TIMEOUT = 120.0


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def orphaned_tags(folder: Path) -> set[str]:
    """Tags whose replacing commit was cut between its two renames: only a trash copy exists."""
    tags = set()
    for name in hidden(folder):
        if name.startswith(TRASH_PREFIX) and name.count("-") >= 2:
            tag = name.removeprefix(TRASH_PREFIX).rsplit("-", 1)[0]
            if not (folder / tag).exists():
                tags.add(tag)
    return tags


def assert_consistent(store: CheckpointStore) -> CheckpointInfo:
    """What a reader sees must be whole: no hidden folder, every checkpoint verifies, and
    `latest` is the highest step and loads into a fresh model. Returns `latest`."""
    listed = store.list_checkpoints(saver.EXPERIMENT)
    assert all(not c.tag.startswith(".") for c in listed), [c.tag for c in listed]
    for info in listed:
        verify_manifest(store.entry(info.experiment, info.tag), deep=True)
    latest = store.latest(saver.EXPERIMENT)
    assert latest.step == max(parse_step(c.tag) or 0 for c in listed)
    meta = load_checkpoint(*saver.build_parts(), store.entry(latest.experiment, latest.tag))
    assert meta["step"] == latest.step and meta["tag"] == latest.tag
    return latest


def assert_cleanup_repairs(store: CheckpointStore) -> int:
    """`cleanup` leaves no hidden folder and restores orphaned tags; returns how many."""
    exp = folder(store, saver.EXPERIMENT)
    orphans = orphaned_tags(exp)
    store.cleanup()
    assert hidden(exp) == []
    for tag in orphans:
        verify_manifest(store.entry(saver.EXPERIMENT, tag), deep=True)
    return len(orphans)


def test_kill_9_at_random_moments_during_saves_never_exposes_a_broken_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx = saver.forkserver()
    save_seconds = saver.measure_save_seconds(tmp_path / "measure")
    root = tmp_path / "checkpoints"
    store = posix_store(root)
    rng = random.Random(SEED)
    mid_save = restored = 0
    previous: CheckpointInfo | None = None
    started = time.monotonic()
    for _ in range(ROUNDS):
        ready = ctx.Event()
        first_step = previous.step + 1 if previous and previous.step else 1
        proc = ctx.Process(target=saver.save_forever, args=(str(root), first_step, ready))
        proc.start()
        assert ready.wait(READY_TIMEOUT), "the saver process never started"
        # Up to three saves in: kills land in step saves, their retention and in commits
        # that replace `best`.
        time.sleep(rng.uniform(0.0, 3.0 * save_seconds))
        proc.kill()
        proc.join()
        assert proc.exitcode == -signal.SIGKILL, "the saver died before it was killed"
        exp = folder(store, saver.EXPERIMENT)
        mid_save += any(n.startswith(STAGING_PREFIX) for n in hidden(exp))
        latest = assert_consistent(store)
        if previous is not None:
            assert latest.step is not None and previous.step is not None
            assert latest.step >= previous.step, "latest went backwards"
        restored += assert_cleanup_repairs(store)
        previous = assert_consistent(store)
    with capsys.disabled():
        print(
            f"\n[crash during save] {ROUNDS} kill rounds, {mid_save} landed mid-save "
            f"(a staging folder was left), {restored} interrupted commits restored, "
            f"save ~{save_seconds * 1000:.1f} ms, {time.monotonic() - started:.1f} s"
        )
    assert mid_save >= 1, "no kill landed inside a save: the delays miss the saves"


def test_kill_9_at_every_file_system_call_of_a_save_is_repaired_by_cleanup(
    tmp_path: Path,
) -> None:
    """Deterministic complement of the random kills: die before each fsync/rename/unlink of
    a save of step_4 (whose retention prunes step_1) followed by a save replacing ``best``."""
    template = tmp_path / "template"
    parts = saver.build_parts()
    for step in (1, 2, 3):
        saver.save_step(parts, template, step)
    saver.save_step(parts, template, 3, BEST_TAG)
    ctx = saver.forkserver()
    root, points, orphans_restored = tmp_path / "checkpoints", 0, 0
    for number in range(1, 500):
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(template, root)
        work = saver.save_step_then_best
        proc = ctx.Process(target=saver.crash_at_call, args=(str(root), number, work))
        proc.start()
        proc.join()
        store = posix_store(root)
        latest = assert_consistent(store)
        assert latest.tag in ("step_3", "step_4")
        if proc.exitcode == 0:
            break  # the whole sequence ran: every crash point has been tried
        assert proc.exitcode == -signal.SIGKILL
        points += 1
        orphans_restored += assert_cleanup_repairs(store)
        after = assert_consistent(store)
        assert store.get(saver.EXPERIMENT, BEST_TAG).step in (3, 4), "best was lost"
        assert after.tag == latest.tag, "cleanup changed which checkpoint is latest"
    assert points >= 20, f"only {points} crash points: the kill hook is not reached"
    assert orphans_restored >= 1, "no crash fell between the two renames of a replacing commit"
    final = sorted(c.tag for c in posix_store(root).list_checkpoints())
    assert final == ["best", "step_2", "step_3", "step_4"]

"""Prune while a saver process commits checkpoints, over many rounds.

The saver (a real process) writes step_<n> with retention and, every second step, ``best``.
Meanwhile the test prunes with keep_last 0..2, with and without keep_best, and with one
protected checkpoint (as a queued validate run would protect its target). Prune must never
delete the latest, ``best``, the step ``best`` came from (keep_best), a protected checkpoint,
or the checkpoint being written (its staging folder is invisible to prune, and the saver
checks after each commit that its checkpoint is there).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import pytest

from tests.reliability import saver
from tests.support.polling import poll
from tests.support.soak import rounds
from tests.support.stores import posix_store
from trainctl.store.checkpoints.manifests import (
    METADATA_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    verify_manifest,
)
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.exceptions import CheckpointProtected
from trainctl.store.names import BEST_TAG, parse_step, step_tag

ROUNDS = 100 * rounds(20)
SEED = int(os.environ.get("TRAINCTL_SOAK_SEED", "4"))
EXP = saver.EXPERIMENT
PROTECTED_TAG = "step_1"
PROTECTED = frozenset({(EXP, PROTECTED_TAG)})


def test_prune_during_saves_never_deletes_latest_best_protected_or_the_one_being_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx = saver.forkserver()
    root = tmp_path / "checkpoints"
    store, rng = posix_store(root), random.Random(SEED)
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=saver.save_forever, args=(str(root), 1, ready, stop, PROTECTED))
    proc.start()
    deleted_total, started = 0, time.monotonic()
    try:
        assert ready.wait(120), "the saver process never started"
        poll(lambda: store.latest_or_none(EXP), what="the saver's first checkpoint")
        for _ in range(ROUNDS):
            assert proc.is_alive(), "the saver died (a checkpoint it had committed vanished?)"
            latest_before = store.latest(EXP)
            keep_last, keep_best = rng.randint(0, 2), rng.random() < 0.5
            outcome = store.prune(
                EXP, keep_last=keep_last, keep_best=keep_best, protected=PROTECTED
            )
            deleted = {c.tag: c for c in outcome.deleted}
            kept = {c.tag: c for c in outcome.kept}
            deleted_total += len(deleted)
            assert all(not t.startswith(".") for t in [*deleted, *kept])
            assert BEST_TAG not in deleted and PROTECTED_TAG not in deleted
            assert all(parse_step(t) is not None for t in deleted), "only step_* is pruned"
            newest_kept = max(parse_step(t) or 0 for t in kept)
            assert all(c.step is not None and c.step < newest_kept for c in deleted.values())
            if keep_best and BEST_TAG in kept:
                assert all(c.step != kept[BEST_TAG].step for c in deleted.values())
            latest_after = store.latest(EXP)
            assert latest_after.step is not None and latest_before.step is not None
            assert latest_after.step >= latest_before.step, "prune removed the latest"
            assert store.get(EXP, PROTECTED_TAG).tag == PROTECTED_TAG
            with pytest.raises(CheckpointProtected):
                store.delete(EXP, PROTECTED_TAG, protected=PROTECTED)
    finally:
        stop.set()
        proc.join(timeout=60)
    assert proc.exitcode == 0, "the saver failed: a checkpoint it had just committed was gone"
    final = store.list_checkpoints(EXP)
    for info in final:
        verify_manifest(store.entry(EXP, info.tag), deep=True)
    assert {BEST_TAG, PROTECTED_TAG} <= {c.tag for c in final}
    steps_saved = store.latest(EXP).step
    with capsys.disabled():
        print(
            f"\n[prune during saves] {ROUNDS} prunes, {deleted_total} checkpoints deleted, "
            f"{steps_saved} steps saved concurrently, {time.monotonic() - started:.1f} s"
        )
    assert deleted_total > 0, "prune never deleted anything: the race was not exercised"


def save_fake(store: CheckpointStore, step: int) -> None:
    """A torch-free checkpoint written the way the worker writes one: stage, manifest, commit."""
    with store.stage(EXP, step_tag(step)) as staged:
        for name in (MODEL_FILE, OPTIMIZER_FILE):
            staged.write(name, os.urandom(64))
        staged.write(METADATA_FILE, json.dumps({"step": step, "created_at": None}).encode())
        staged.commit()


def test_listing_while_retention_deletes_never_raises(tmp_path: Path) -> None:
    """Readers (GET /checkpoints, latest, prune's own listing) race deletes all the time: a
    checkpoint that vanishes while it is being read is simply not listed."""
    store = posix_store(tmp_path)
    save_fake(store, 1)
    done, failures = threading.Event(), []

    def save_and_retain() -> None:
        try:
            for step in range(2, 200):
                save_fake(store, step)
                store.retain(EXP, 1)
        finally:
            done.set()

    writer = threading.Thread(target=save_and_retain)
    writer.start()
    reads = 0
    while not done.is_set():
        for read in (lambda: store.list_checkpoints(EXP), store.latest_or_none, store.latest):
            try:
                read()
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
        reads += 1
    writer.join()
    assert failures == [], f"{len(failures)} of {3 * reads} reads failed, e.g. {failures[0]}"
    assert store.latest(EXP).tag == "step_199"

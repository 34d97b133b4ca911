"""A run that starts to depend on a checkpoint while retention deletes old ones.

Submitting (check the checkpoint, queue the run) and deleting (read what queued runs need,
delete the rest) take turns under the experiment's guard: a flock on POSIX, a lease in the
run database for a bucket, where the two sides are two storages as two processes open them.
Each test stops one side inside its turn and starts the other: the other waits, then sees
the first side's outcome.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.service.fakes import save_checkpoint
from tests.support.s3server import S3Server
from tests.support.stores import dataset_store, posix_store, s3_store
from trainctl.service.settings import Settings
from trainctl.service.submit import submit_run
from trainctl.store.checkpoints.protection import ProtectionPolicy
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.guards import GuardLeases
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.exceptions import CheckpointNotFound
from trainctl.store.kinds.validate import ValidateRequest


class Paused:
    """Wrap a callable so that its first call signals `inside` and waits for `release`."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.inside, self.release = fn, threading.Event(), threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.inside.set()
        assert self.release.wait(30), "never released"
        return self.fn(*args, **kwargs)


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except Exception as exc:
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def submit_validate(settings: Settings, runs: RunStore, ckpts: CheckpointStore) -> Run:
    """Submit a validate run of exp/step_10 (its submit never reads the exports store)."""
    request = ValidateRequest(checkpoint="exp/step_10", num_batches=1)
    exports = posix_store(settings.layout.exports)
    datasets = dataset_store(settings.data_dir)
    return submit_run("validate", request, settings=settings, runs=runs, ckpts=ckpts,
                      exports=exports, datasets=datasets)  # fmt: skip


@pytest.fixture(params=["posix", "s3"])
def sides(
    request: pytest.FixtureRequest, ckpts: CheckpointStore, runs: RunStore, tmp_path: Path
) -> tuple[CheckpointStore, CheckpointStore]:
    """The service's store (it submits) and a worker's (its retention deletes), with two
    steps saved: on POSIX the one store of the shared folders; in a bucket, two storages as
    two processes open them, whose guard is a lease in the run database they share."""
    pair = (ckpts, ckpts)
    if request.param == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        bucket = server.new_bucket()
        service, worker = (
            s3_store(server, bucket, tmp_path / name, leases=GuardLeases(runs.engine))
            for name in ("service-cache", "worker-cache")
        )
        pair = (service, worker)
    save_checkpoint(pair[0], "exp", step=10)
    save_checkpoint(pair[0], "exp", step=20)
    return pair


def test_retention_waits_for_a_run_being_queued_and_spares_its_checkpoint(
    settings: Settings,
    runs: RunStore,
    sides: tuple[CheckpointStore, CheckpointStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ckpts, worker = sides
    enqueue = Paused(runs.enqueue_all)  # what submit queues through, one run or a sweep's
    monkeypatch.setattr(runs, "enqueue_all", enqueue)
    submitter, submitted = in_thread(lambda: submit_validate(settings, runs, ckpts))
    assert enqueue.inside.wait(30)  # checked step_10, about to queue the run

    # What a worker's retention does after a save: keep 1 step, spare what runs need.
    retention, retained = in_thread(lambda: ProtectionPolicy(runs, worker).retain("exp", 1))
    retention.join(0.5)
    assert retention.is_alive(), "retention did not wait for the run being queued"
    enqueue.release.set()
    submitter.join(30)
    retention.join(30)

    assert "error" not in submitted and "error" not in retained
    assert retained["value"] == []  # step_10 spared: the queued run needs it
    assert ckpts.get("exp", "step_10").tag == "step_10"
    assert ("exp", "step_10") in runs.protected_checkpoints()


def test_a_run_queued_while_retention_runs_finds_its_checkpoint_gone_not_half_there(
    settings: Settings,
    runs: RunStore,
    sides: tuple[CheckpointStore, CheckpointStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ckpts, worker = sides
    protected = Paused(runs.protected_checkpoints)
    monkeypatch.setattr(runs, "protected_checkpoints", protected)
    retention, retained = in_thread(lambda: ProtectionPolicy(runs, worker).retain("exp", 1))
    assert protected.inside.wait(30)  # retention holds the guard, about to read the runs

    submitter, submitted = in_thread(lambda: submit_validate(settings, runs, ckpts))
    submitter.join(0.5)
    assert submitter.is_alive(), "the submit did not wait for retention"
    protected.release.set()
    retention.join(30)
    submitter.join(30)

    assert [i.tag for i in retained["value"]] == ["step_10"]
    assert isinstance(submitted.get("error"), CheckpointNotFound)
    assert protected.fn() == set()  # no run was queued for a deleted checkpoint


def test_guards_of_one_thread_nest(sides: tuple[CheckpointStore, CheckpointStore]) -> None:
    two_steps = sides[0]
    # ProtectionPolicy.pinned holds the guard while a run is queued; a delete in the same
    # thread (a test, a script) takes it again.
    with two_steps.guard("exp"), two_steps.guard("exp"):
        two_steps.delete("exp", "step_10")
    with pytest.raises(CheckpointNotFound):
        two_steps.get("exp", "step_10")

"""The checkpoint store's policy, exercised with small fake checkpoints (no torch), on four
storages: the folders (POSIX), the one in memory, and a bucket of each of two real S3 servers,
SeaweedFS and `rclone serve s3` (its guard a lease in a run database). That all pass the
same tests shows the storage protocol is all the store needs (docs/design/checkpoints.md,
"Checkpoint store", "Storage"). What only folders can do wrong (links, stray files,
interrupted renames) is tested on POSIX below; what only a bucket can, in
test_s3_storage.py and test_s3_compatible.py."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import trainctl.store.checkpoints.store as checkpoints_module
from tests.support.s3server import S3Server
from tests.support.stores import (
    folder,
    manifest_of,
    posix_store,
    read_files,
    rewrite,
    s3_store,
    write_entry,
)
from trainctl.store.checkpoints.manifests import (
    MANIFEST_FILE,
    METADATA_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    verify_manifest,
)
from trainctl.store.checkpoints.memory import MemoryStorage
from trainctl.store.checkpoints.posix import STAGING_PREFIX, TRASH_PREFIX, PosixStorage
from trainctl.store.checkpoints.protection import ProtectionPolicy
from trainctl.store.checkpoints.s3 import S3Storage
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.guards import GuardLeases
from trainctl.store.db.runs import RunStore
from trainctl.store.exceptions import (
    CheckpointCorrupt,
    CheckpointNotFound,
    CheckpointProtected,
    InvalidName,
    InvalidRequest,
)
from trainctl.store.names import BEST_TAG, parse_step, step_tag, validate_name


class Clock:
    """A memory storage's clock that a test can set, ticking a second per commit."""

    def __init__(self) -> None:
        self.now = 1e9

    def __call__(self) -> float:
        self.now += 1
        return self.now


@pytest.fixture(scope="module")
def guard_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunStore]:
    """The run database that holds the S3 stores' guards (one for the module: each test's
    bucket names its own leases)."""
    runs = RunStore(f"sqlite:///{tmp_path_factory.mktemp('guards') / 'runs.db'}")
    runs.create_all()
    yield runs
    runs.close()


@pytest.fixture(params=["posix", "memory", "s3", "rclone"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStore:
    if request.param == "posix":
        return posix_store(tmp_path / "checkpoints")
    if request.param in ("s3", "rclone"):  # two S3 servers: SeaweedFS, `rclone serve s3`
        server: S3Server = request.getfixturevalue(f"{request.param}_server")
        leases = GuardLeases(request.getfixturevalue("guard_db").engine)
        return s3_store(
            server, server.new_bucket(), tmp_path / "cache", clock=Clock(), leases=leases
        )
    return CheckpointStore(MemoryStorage(clock=Clock()))


@pytest.fixture
def posix(tmp_path: Path) -> CheckpointStore:
    return posix_store(tmp_path / "checkpoints")


def save(
    store: CheckpointStore,
    experiment: str,
    tag: str | None = None,
    *,
    step: int = 0,
    best_loss: float | None = None,
    created_at: str | None = None,
    weights: bytes = b"weights",
) -> None:
    """Write a fake checkpoint the way the worker does: stage, manifest last, commit."""
    metadata: dict[str, Any] = {"step": step, "token_count": step * 1000, "run_id": "run-1"}
    metadata.update(best_loss=best_loss, created_at=created_at)
    with store.stage(experiment, tag or step_tag(step)) as staged:
        staged.write(MODEL_FILE, weights)
        staged.write(OPTIMIZER_FILE, b"optimizer state")
        staged.write(METADATA_FILE, json.dumps(metadata).encode())
        staged.commit()


def committed_at(store: CheckpointStore, experiment: str, tag: str, when: float) -> None:
    """Make a checkpoint look committed at `when`: its manifest's mtime (POSIX), or the
    memory storage's clock at a commit of the same files."""
    if isinstance(store.storage, PosixStorage):
        os.utime(folder(store, experiment, tag) / MANIFEST_FILE, (when, when))
        return
    assert isinstance(store.storage, MemoryStorage | S3Storage)
    clock, store.storage.clock = store.storage.clock, lambda: when
    try:
        write_entry(store, experiment, tag, read_files(store, experiment, tag))
    finally:
        store.storage.clock = clock


def tags(store: CheckpointStore, experiment: str | None = None) -> list[str]:
    return [i.tag for i in store.list_checkpoints(experiment)]


def served(store: CheckpointStore, experiment: str, tag: str, name: str) -> bytes:
    _, reader = store.open_file(experiment, tag, name)
    with reader:
        return reader.read()


# --- names ---


@pytest.mark.parametrize(
    "value", ["exp1", "a", "GPT-2_small.v3", "step_100", "best", "x" * 128, "9lives"]
)
def test_validate_name_accepts_plain_names(value: str) -> None:
    assert validate_name("experiment", value) == value


@pytest.mark.parametrize(
    "value",
    ["", ".", "..", ".hidden", "a..b", "-dash", "_under", "a/b", "a\\b", "a b", "x" * 129,
     "a\x00b", "exp\n", "é", "%2e%2e"],
)  # fmt: skip
def test_validate_name_rejects_unsafe_names_and_names_the_problem(value: str) -> None:
    with pytest.raises(InvalidName, match="invalid tag name") as caught:
        validate_name("tag", value)
    assert repr(value) in str(caught.value)


def test_step_tags_round_trip_and_other_tags_have_no_step() -> None:
    assert step_tag(42) == "step_42"
    assert parse_step("step_42") == 42
    assert parse_step("step_0") == 0
    for tag in ["best", "step_", "step_007", "step_-1", "step_1x", "my-tag"]:
        assert parse_step(tag) is None


def test_latest_is_a_reserved_ref_not_a_tag(store: CheckpointStore) -> None:
    with pytest.raises(InvalidName, match="reserved"):
        store.stage("exp", "latest")


# --- manifests ---


def test_the_manifest_records_name_size_and_hash_and_is_written_last(
    store: CheckpointStore,
) -> None:
    with store.stage("exp", "step_1") as staged:
        staged.write(MODEL_FILE, b"abc")
        staged.write(METADATA_FILE, b"{}")
        manifest = staged.commit()
    assert manifest == json.loads(served(store, "exp", "step_1", MANIFEST_FILE))
    entry = manifest["files"][0]
    assert manifest["version"] == 1 and [f["name"] for f in manifest["files"]] == [
        MODEL_FILE, METADATA_FILE,
    ]  # fmt: skip
    assert entry["name"] == MODEL_FILE and entry["size"] == 3
    assert entry["sha256"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert verify_manifest(store.entry("exp", "step_1")) == manifest


def test_a_file_written_through_a_sink_takes_the_hash_its_writer_gives(
    store: CheckpointStore,
) -> None:
    with store.stage("exp", "step_1") as staged:
        sink = staged.create(MODEL_FILE)
        for chunk in (b"a", b"bc"):
            sink.write(chunk)
        sink.close()
        staged.write(METADATA_FILE, b"{}")
        manifest = staged.commit({MODEL_FILE: "0" * 64})
    assert manifest["files"][0] == {"name": MODEL_FILE, "size": 3, "sha256": "0" * 64}


def test_a_commit_of_unfinished_files_is_refused_and_leaves_nothing(
    store: CheckpointStore,
) -> None:
    with pytest.raises(ValueError, match="unfinished"), store.stage("exp", "step_1") as staged:
        staged.create(MODEL_FILE).write(b"w")  # never closed, and no hash given
        staged.commit()
    with pytest.raises(ValueError, match=MODEL_FILE), store.stage("exp", "step_2") as staged:
        staged.create(MODEL_FILE).close()
        staged.commit()
    assert tags(store) == [] and store.cleanup() == []


def test_the_manifest_refuses_names_that_are_not_plain_files(store: CheckpointStore) -> None:
    with store.stage("exp", "step_1") as staged:
        for name in ["../escape", MANIFEST_FILE, ".hidden"]:
            with pytest.raises(InvalidName):
                staged.create(name)


def test_verify_manifest_detects_a_flipped_byte_only_when_deep(store: CheckpointStore) -> None:
    save(store, "exp", step=1, weights=b"\x00" * 64)
    rewrite(store, "exp", "step_1", {MODEL_FILE: b"\x00" * 63 + b"\x01"})
    verify_manifest(store.entry("exp", "step_1"), deep=False)
    with pytest.raises(CheckpointCorrupt, match=f"{MODEL_FILE}: sha256"):
        verify_manifest(store.entry("exp", "step_1"))


def test_verify_manifest_detects_truncation(store: CheckpointStore) -> None:
    save(store, "exp", step=1)
    rewrite(store, "exp", "step_1", {OPTIMIZER_FILE: b"opt"})
    with pytest.raises(CheckpointCorrupt, match=f"{OPTIMIZER_FILE}: size 3 bytes"):
        verify_manifest(store.entry("exp", "step_1"), deep=False)


def test_verify_manifest_rejects_a_missing_or_hostile_manifest(store: CheckpointStore) -> None:
    write_entry(store, "exp", "step_1", {MODEL_FILE: b"w"})
    with pytest.raises(CheckpointCorrupt, match="missing"):
        verify_manifest(store.entry("exp", "step_1"))
    hostile = {"version": 1, "files": [{"name": "../x", "size": 0, "sha256": "0" * 64}]}
    write_entry(store, "exp", "step_1", {MANIFEST_FILE: json.dumps(hostile).encode()})
    with pytest.raises(CheckpointCorrupt, match="bad or duplicate"):
        verify_manifest(store.entry("exp", "step_1"))


# --- listing ---


def test_only_complete_checkpoints_are_listed_or_latest(store: CheckpointStore) -> None:
    for step in (1, 2, 3, 4, 5):
        save(store, "exp", step=step)
    rewrite(store, "exp", "step_2", {MANIFEST_FILE: None})  # crashed before the manifest
    rewrite(store, "exp", "step_3", {MODEL_FILE: None})  # file lost after the manifest
    rewrite(store, "exp", "step_4", {OPTIMIZER_FILE: b"short"})  # wrong size
    rewrite(store, "exp", "step_5", {METADATA_FILE: b"{not json"})
    staged = store.stage("exp", "step_9")  # a save in progress
    staged.write(METADATA_FILE, b'{"step": 9}')

    assert tags(store) == ["step_1"]
    assert store.latest("exp").tag == "step_1"
    with pytest.raises(CheckpointNotFound):
        store.get("exp", "step_4")
    staged.abort()


def test_list_sorts_by_experiment_then_step_with_user_tags_last(store: CheckpointStore) -> None:
    save(store, "b", step=10)
    save(store, "a", "release", step=1)
    for step in (100, 20):
        save(store, "a", step=step)
    listed = [(i.experiment, i.tag) for i in store.list_checkpoints()]
    # the tagged "release" copy carries step 1 in its metadata, so it sorts by that step
    assert listed == [("a", "release"), ("a", "step_20"), ("a", "step_100"), ("b", "step_10")]


def test_checkpoint_info_reads_metadata_once_for_every_caller(store: CheckpointStore) -> None:
    save(store, "exp", step=7, best_loss=2.5, created_at="2025-01-01T00:00:00+00:00")
    info = store.get("exp", "step_7")
    assert info.step == 7 and info.token_count == 7000
    assert info.best_loss == 2.5 and info.run_id == "run-1"
    assert info.created_at == "2025-01-01T00:00:00+00:00"
    assert info.size_bytes == sum(f["size"] for f in info.files)
    assert {f["name"] for f in info.files} == {MODEL_FILE, OPTIMIZER_FILE, METADATA_FILE}
    assert not hasattr(info, "path")  # its files are read through the store


def test_get_names_a_missing_experiment_or_tag(store: CheckpointStore) -> None:
    with pytest.raises(CheckpointNotFound, match="experiment 'nope' does not exist"):
        store.get("nope", "step_1")
    save(store, "exp", step=1)
    with pytest.raises(CheckpointNotFound, match="'step_2' in experiment 'exp'"):
        store.get("exp", "step_2")


def test_experiments_lists_every_experiment_written_to(store: CheckpointStore) -> None:
    assert store.experiments() == []
    save(store, "b", step=1)
    save(store, "a", step=1)
    assert store.experiments() == ["a", "b"]


# --- latest and best ---


def test_latest_is_the_highest_step_not_the_newest(store: CheckpointStore) -> None:
    save(store, "exp", step=200)
    save(store, "exp", step=100)
    save(store, "exp", "user-tag", step=500)
    committed_at(store, "exp", "step_100", 2e9)
    assert store.latest("exp").tag == "step_200"
    assert store.resolve("exp", "latest").tag == "step_200"


def test_latest_across_experiments_is_the_most_recently_created(store: CheckpointStore) -> None:
    save(store, "a", step=900, created_at="2025-01-01T00:00:00+00:00")
    save(store, "b", step=5, created_at="2025-03-01T00:00:00Z")
    save(store, "c", step=50, created_at="2025-02-01T00:00:00")
    assert (store.latest().experiment, store.latest().tag) == ("b", "step_5")


def test_latest_across_experiments_falls_back_to_the_commit_time_without_created_at(
    store: CheckpointStore,
) -> None:
    save(store, "a", step=900)
    save(store, "b", step=5)
    committed_at(store, "a", "step_900", 2e9)
    committed_at(store, "b", "step_5", 1e9)
    assert store.latest().experiment == "a"
    committed_at(store, "b", "step_5", 3e9)
    assert store.latest().experiment == "b"


def test_latest_without_checkpoints_says_so(store: CheckpointStore) -> None:
    with pytest.raises(CheckpointNotFound, match="no checkpoints yet"):
        store.latest()
    staged = store.stage("exp", "step_1")
    with pytest.raises(CheckpointNotFound, match="no checkpoint for experiment 'exp' yet"):
        store.latest("exp")
    assert store.latest_or_none("exp") is None
    staged.abort()


def test_best_of_an_experiment_and_across_experiments(store: CheckpointStore) -> None:
    save(store, "a", BEST_TAG, step=10, best_loss=3.0)
    save(store, "b", BEST_TAG, step=20, best_loss=2.0)
    save(store, "c", step=30, best_loss=1.0)  # not tagged best
    assert store.best("a").best_loss == 3.0
    assert store.resolve("a", "best").step == 10
    assert store.best().experiment == "b"
    with pytest.raises(CheckpointNotFound):
        store.best("c")


def test_latest_of_a_run_is_the_highest_step_it_saved(store: CheckpointStore) -> None:
    for step in (1, 2, 3):
        save(store, "exp", step=step)
    assert store.latest_of_run("exp", "run-1") is not None
    assert store.latest_of_run("exp", "run-1").tag == "step_3"  # type: ignore[union-attr]
    assert store.latest_of_run("exp", "run-2") is None


# --- commit and cleanup ---


def test_commit_replaces_an_existing_tag_and_leaves_one_entry(store: CheckpointStore) -> None:
    save(store, "exp", BEST_TAG, step=1, best_loss=3.0)
    save(store, "exp", BEST_TAG, step=2, best_loss=2.0)
    assert store.best("exp").step == 2
    assert store.storage.tags("exp") == [BEST_TAG]


def test_a_commit_that_may_not_replace_refuses_an_existing_tag(store: CheckpointStore) -> None:
    save(store, "exp", step=1, weights=b"first")
    with pytest.raises(FileExistsError), store.stage("exp", "step_1") as staged:
        staged.write(MODEL_FILE, b"second")
        staged.commit(replace=False)
    assert served(store, "exp", "step_1", MODEL_FILE) == b"first"
    assert store.cleanup() == []  # the refused stage was removed at once


def test_a_save_that_fails_leaves_nothing_behind(store: CheckpointStore) -> None:
    save(store, "exp", step=1)
    with pytest.raises(RuntimeError), store.stage("exp", "step_2") as staged:
        staged.write(MODEL_FILE, b"w")
        raise RuntimeError("the save died")

    def lease_lost() -> None:
        raise RuntimeError("lease lost")

    with pytest.raises(RuntimeError), store.stage("exp", "step_3") as staged:
        staged.write(MODEL_FILE, b"w")
        staged.commit(before_commit=lease_lost)
    assert tags(store) == ["step_1"]
    assert store.cleanup() == []


def test_cleanup_sweeps_stages_never_committed_nor_aborted(store: CheckpointStore) -> None:
    save(store, "exp", step=1)
    for experiment in ("exp", "other"):
        store.stage(experiment, "step_2").write(MODEL_FILE, b"half a save")
    assert len(store.cleanup("exp")) == 1
    assert len(store.cleanup()) == 1
    assert store.cleanup() == []
    assert tags(store) == ["step_1"]


# --- delete, prune, retain ---


def test_delete_removes_the_checkpoint_and_returns_what_it_was(store: CheckpointStore) -> None:
    save(store, "exp", step=1)
    assert store.delete("exp", "step_1").tag == "step_1"
    assert store.storage.tags("exp") == []
    with pytest.raises(CheckpointNotFound):
        store.delete("exp", "step_1")


def test_delete_refuses_a_protected_checkpoint(store: CheckpointStore) -> None:
    save(store, "exp", step=1)
    with pytest.raises(CheckpointProtected, match="in use by a queued or running run"):
        store.delete("exp", "step_1", protected={("exp", "step_1")})
    assert tags(store) == ["step_1"]


def test_a_refused_delete_gives_the_reason_it_is_asked_under_the_guard(
    store: CheckpointStore,
) -> None:
    save(store, "exp", step=1)
    asked: list[bool] = []

    def protected() -> dict[tuple[str, str], str]:
        held = threading.Thread(target=lambda: asked.append(try_guard(store, "exp")))
        held.start()
        held.join()
        return {("exp", "step_1"): "the latest of a running train run"}

    with pytest.raises(CheckpointProtected, match="is the latest of a running train run"):
        store.delete("exp", "step_1", protected=protected)
    assert asked == [False]  # another thread could not take the guard meanwhile


def try_guard(store: CheckpointStore, experiment: str, timeout: float = 0.2) -> bool:
    """Whether this thread takes the guard within `timeout` (then releases it)."""
    done = threading.Event()

    def take() -> None:
        with store.guard(experiment):
            done.set()

    threading.Thread(target=take, daemon=True).start()
    return done.wait(timeout)


def test_the_guard_excludes_other_threads_and_nests_within_one(store: CheckpointStore) -> None:
    with store.guard("exp"):
        with store.guard("exp"):  # re-entrant: a second take must not deadlock
            assert not try_guard(store, "exp")
        assert not try_guard(store, "exp")
        assert try_guard(store, "other")  # one guard per experiment
    assert try_guard(store, "exp", timeout=10)


def test_the_protection_policy_spares_what_runs_need_on_any_storage(
    store: CheckpointStore, tmp_path: Path
) -> None:
    runs = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    runs.create_all()
    for step in (1, 2, 3):
        save(store, "exp", step=step)
    policy = ProtectionPolicy(runs, store)
    with policy.pinned("exp", "step_1") as info:  # as submit queues a validation of it
        runs.enqueue("validate", "exp", {}, depends_on=[("exp", info.tag)])
    runs.enqueue("train", "exp", {})  # an active train run keeps the latest

    with pytest.raises(CheckpointProtected, match="in use by a queued or running run"):
        policy.delete("exp", "step_1")
    with pytest.raises(CheckpointProtected, match="the latest of experiment 'exp'"):
        policy.delete("exp", "step_3")
    pruned = policy.prune("exp", keep_last=0, keep_best=False, dry_run=False)
    assert [i.tag for i in pruned.deleted] == ["step_2"]
    assert policy.retain("exp", 0) == [] and tags(store) == ["step_1", "step_3"]
    runs.close()


def test_prune_keeps_the_newest_steps_best_and_user_tags(store: CheckpointStore) -> None:
    for step in (1, 2, 3, 4, 5):
        save(store, "exp", step=step)
    save(store, "exp", BEST_TAG, step=2, best_loss=1.0)
    save(store, "exp", "release", step=1)

    result = store.prune("exp", keep_last=2)

    assert [i.tag for i in result.deleted] == ["step_3", "step_1"]
    # "best" and "release" sort by the step in their metadata, ties by tag
    assert tags(store) == ["release", BEST_TAG, "step_2", "step_4", "step_5"]
    assert sorted(i.tag for i in result.kept) == sorted(tags(store))


def test_prune_never_deletes_latest_even_with_keep_last_zero(store: CheckpointStore) -> None:
    for step in (1, 2, 3):
        save(store, "exp", step=step)
    store.prune("exp", keep_last=0, keep_best=False)
    assert tags(store) == ["step_3"]


def test_prune_dry_run_reports_without_deleting(store: CheckpointStore) -> None:
    for step in (1, 2, 3):
        save(store, "exp", step=step)
    result = store.prune("exp", keep_last=1, dry_run=True)
    assert [i.tag for i in result.deleted] == ["step_2", "step_1"]
    assert tags(store) == ["step_1", "step_2", "step_3"]


def test_prune_spares_protected_checkpoints(store: CheckpointStore) -> None:
    for step in (1, 2, 3):
        save(store, "exp", step=step)
    store.prune("exp", keep_last=1, protected={("exp", "step_1"), ("other", "step_2")})
    assert tags(store) == ["step_1", "step_3"]


def test_prune_rejects_a_negative_keep_last_and_a_missing_experiment(
    store: CheckpointStore,
) -> None:
    save(store, "exp", step=1)
    with pytest.raises(InvalidRequest, match="keep_last"):
        store.prune("exp", keep_last=-1)
    with pytest.raises(CheckpointNotFound, match="'nope' does not exist"):
        store.prune("nope", keep_last=1)


def test_retain_keeps_max_keep_steps_and_returns_the_deleted(store: CheckpointStore) -> None:
    for step in (10, 20, 30, 40):
        save(store, "exp", step=step)
    save(store, "exp", BEST_TAG, step=10, best_loss=0.5)
    deleted = store.retain("exp", max_keep=2)
    # `best` is its own copy, so the step it came from is not kept on its account.
    assert sorted(i.tag for i in deleted) == ["step_10", "step_20"]
    assert sorted(tags(store)) == [BEST_TAG, "step_30", "step_40"]


# --- safe file resolution ---


def test_open_file_serves_manifest_listed_files_and_the_manifest(store: CheckpointStore) -> None:
    save(store, "exp", step=1, weights=b"the weights")
    assert served(store, "exp", "step_1", MODEL_FILE) == b"the weights"
    manifest = served(store, "exp", "step_1", MANIFEST_FILE)
    assert json.loads(manifest)["files"][0]["sha256"] == hashlib.sha256(b"the weights").hexdigest()
    info, reader = store.open_file("exp", "step_1", MODEL_FILE)
    with reader:
        assert reader.size == len(b"the weights") == info.files[0]["size"]


HOSTILE_NAMES = [
    "../x", "..", ".", "%2e%2e/x", "%2e%2e", "/etc/passwd", "a\\b", "x\x00y",
    "manifest.json/../../x", "", "MODEL.SAFETENSORS", " model.safetensors", "extra.bin",
]  # fmt: skip


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_open_file_refuses_hostile_names(store: CheckpointStore, name: str) -> None:
    save(store, "exp", step=1)
    rewrite(store, "exp", "step_1", {"extra.bin": b"present but not in the manifest"})
    with pytest.raises((InvalidName, CheckpointNotFound)):
        store.open_file("exp", "step_1", name)


@pytest.mark.parametrize(("experiment", "tag"), [("..", "step_1"), ("exp", "../exp")])
def test_open_file_refuses_hostile_experiment_and_tag(
    store: CheckpointStore, experiment: str, tag: str
) -> None:
    save(store, "exp", step=1)
    with pytest.raises(InvalidName):
        store.open_file(experiment, tag, MODEL_FILE)


@pytest.mark.parametrize(
    "content",
    [b"[" * 100_000 + b"]" * 100_000, b'{"step": 1, "pad": "' + b"x" * (5 << 20) + b'"}'],
    ids=["nested-100k-deep", "over-4-MiB"],
)
@pytest.mark.parametrize("name", [METADATA_FILE, MANIFEST_FILE])
def test_a_huge_or_deeply_nested_json_file_hides_its_checkpoint_not_the_listing(
    store: CheckpointStore, name: str, content: bytes
) -> None:
    save(store, "exp", step=1)
    save(store, "exp", step=2)
    rewrite(store, "exp", "step_2", {name: content})

    assert tags(store) == ["step_1"]
    assert store.latest().tag == "step_1"
    with pytest.raises(CheckpointNotFound):
        store.get("exp", "step_2")


def test_latest_of_an_experiment_reads_only_the_newest_entries(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in range(1, 31):
        save(store, "exp", step=step)
    rewrite(store, "exp", "step_30", {MANIFEST_FILE: None})  # a crashed save
    read: list[str] = []
    real: Callable[..., Any] = checkpoints_module.read_info

    def counting(files: Any, experiment: str, tag: str) -> Any:
        read.append(tag)
        return real(files, experiment, tag)

    monkeypatch.setattr(checkpoints_module, "read_info", counting)
    assert store.latest("exp").tag == "step_29"
    # not all 30: this is the most polled read (on S3 an entry without its manifest, the
    # commit marker, is not even listed)
    crashed = ["step_30"] if "step_30" in store.storage.tags("exp") else []
    assert read == [*crashed, "step_29"]


def test_a_hidden_bad_checkpoint_is_reported_once_in_the_log(
    store: CheckpointStore, caplog: pytest.LogCaptureFixture
) -> None:
    save(store, "exp", step=2)
    rewrite(store, "exp", "step_2", {MANIFEST_FILE: b"{not json"})

    with caplog.at_level("WARNING", logger="trainctl.store.checkpoints.store"):
        for _ in range(3):
            assert store.list_checkpoints("exp") == []

    [record] = [r for r in caplog.records if "not listing" in r.getMessage()]
    message = record.getMessage()
    assert store.describe("exp", "step_2") in message and "cannot be read as JSON" in message


def test_a_reader_offers_a_local_path_only_where_the_file_is_local(
    store: CheckpointStore,
) -> None:
    save(store, "exp", step=1, weights=b"mapped")
    with store.entry("exp", "step_1").open(MODEL_FILE) as reader:
        if isinstance(store.storage, MemoryStorage):
            assert reader.local_path is None
        else:  # a POSIX file, or an S3 object's copy in the local cache
            assert reader.local_path is not None
            assert Path(reader.local_path).read_bytes() == b"mapped"
        assert reader.read() == b"mapped"
    with pytest.raises(FileNotFoundError):
        store.entry("exp", "step_1").open("absent.bin")


# --- folders (POSIX): what a shared filesystem can hold that the store never made ----------


def test_loose_files_and_hidden_folders_are_not_listed(posix: CheckpointStore) -> None:
    save(posix, "exp", step=1)
    (folder(posix, "exp") / "loose-file").write_text("not a checkpoint")
    (folder(posix, "exp") / ".hidden").mkdir()
    (posix.storage.root / ".hidden").mkdir()  # type: ignore[attr-defined]
    assert tags(posix) == ["step_1"] and posix.experiments() == ["exp"]


def test_a_replacing_commit_leaves_no_trash(posix: CheckpointStore) -> None:
    save(posix, "exp", BEST_TAG, step=1, best_loss=3.0)
    save(posix, "exp", BEST_TAG, step=2, best_loss=2.0)
    assert sorted(p.name for p in folder(posix, "exp").iterdir()) == [BEST_TAG]


def test_cleanup_removes_staging_and_restores_an_orphaned_trash(posix: CheckpointStore) -> None:
    save(posix, "exp", BEST_TAG, step=1, best_loss=1.0)
    save(posix, "exp", step=2)
    exp = folder(posix, "exp")
    posix.stage("exp", "step_3")
    [staging] = [p for p in exp.iterdir() if p.name.startswith(STAGING_PREFIX)]
    orphan = exp / f"{TRASH_PREFIX}{BEST_TAG}-{'a' * 32}"
    os.rename(exp / BEST_TAG, orphan)  # a crash between commit's two renames
    stale = exp / f"{TRASH_PREFIX}step_2-{'b' * 32}"
    stale.mkdir()  # step_2 is in place, so this trash is a leftover

    handled = posix.cleanup()

    assert set(handled) == {("exp", p.name) for p in (staging, orphan, stale)}
    assert sorted(p.name for p in exp.iterdir()) == [BEST_TAG, "step_2"]
    assert posix.best("exp").step == 1


def test_cleanup_never_resurrects_a_deleted_checkpoint(posix: CheckpointStore) -> None:
    save(posix, "exp", step=1)
    exp = folder(posix, "exp")
    os.rename(exp / "step_1", exp / f"{TRASH_PREFIX}{'c' * 32}")  # crash inside delete
    posix.cleanup("exp")
    assert list(exp.iterdir()) == []


def test_staging_folders_are_hidden_and_unique(posix: CheckpointStore) -> None:
    posix.stage("exp", "step_1")
    posix.stage("exp", "step_1")
    staged = [p.name for p in folder(posix, "exp").iterdir()]
    assert len(set(staged)) == 2
    assert all(name.startswith(STAGING_PREFIX + "step_1-") for name in staged)


def test_symlinked_checkpoint_folders_are_not_listed(posix: CheckpointStore) -> None:
    save(posix, "exp", step=1)
    os.symlink(folder(posix, "exp", "step_1"), folder(posix, "exp") / "step_2")
    assert tags(posix) == ["step_1"]


def plant_link(path: Path, target: Path) -> None:
    """Replace the file at `path` by a link to `target`, a file of the same size, so that a
    check of sizes alone would not notice."""
    target.write_bytes(b"s" * path.stat().st_size)
    path.unlink()
    os.symlink(target, path)


@pytest.mark.parametrize("name", [MODEL_FILE, OPTIMIZER_FILE, METADATA_FILE, MANIFEST_FILE])
def test_a_checkpoint_with_a_file_that_is_a_link_is_invisible_to_every_reader(
    posix: CheckpointStore, tmp_path: Path, name: str
) -> None:
    save(posix, "exp", step=1)
    save(posix, "exp", step=2)
    plant_link(folder(posix, "exp", "step_2") / name, tmp_path / "secret")

    assert tags(posix, "exp") == ["step_1"]
    assert posix.latest("exp").tag == "step_1"
    with pytest.raises(CheckpointNotFound):
        posix.get("exp", "step_2")
    with pytest.raises(CheckpointNotFound):
        posix.open_file("exp", "step_2", name)
    with pytest.raises(CheckpointCorrupt, match="missing"):
        verify_manifest(posix.entry("exp", "step_2"), deep=True)


def test_a_link_swapped_in_after_the_listing_is_still_not_followed(
    posix: CheckpointStore, tmp_path: Path
) -> None:
    save(posix, "exp", step=1)
    posix.get("exp", "step_1")  # complete when listed...
    plant_link(folder(posix, "exp", "step_1") / MODEL_FILE, tmp_path / "secret")  # ...a link
    with pytest.raises(FileNotFoundError, match="not a regular file"):
        posix.entry("exp", "step_1").open(MODEL_FILE)


def test_a_reader_keeps_the_file_it_opened_whatever_its_name_points_to_later(
    posix: CheckpointStore,
) -> None:
    save(posix, "exp", step=1, weights=b"checked")
    with posix.entry("exp", "step_1").open(MODEL_FILE) as reader:
        path = folder(posix, "exp", "step_1") / MODEL_FILE
        path.unlink()
        path.write_bytes(b"swapped")
        assert reader.local_path is not None
        assert Path(reader.local_path).read_bytes() == reader.read() == b"checked"


def test_a_tag_or_experiment_folder_that_is_a_link_is_neither_listed_read_nor_pruned(
    posix: CheckpointStore, tmp_path: Path
) -> None:
    elsewhere = posix_store(tmp_path / "elsewhere")
    save(elsewhere, "outside", step=1)
    save(elsewhere, "outside", step=2)
    save(posix, "exp", step=1)
    outside = folder(elsewhere, "outside")
    os.symlink(outside, folder(posix, "linked"))
    os.symlink(outside / "step_2", folder(posix, "exp") / "step_9")

    assert [(i.experiment, i.tag) for i in posix.list_checkpoints()] == [("exp", "step_1")]
    assert posix.list_checkpoints("linked") == []
    assert posix.latest_or_none("linked") is None
    assert posix.latest("exp").tag == "step_1"
    for experiment, tag in [("linked", "step_1"), ("exp", "step_9")]:
        with pytest.raises(CheckpointNotFound):
            posix.get(experiment, tag)
    with pytest.raises(CheckpointNotFound):
        posix.prune("linked", keep_last=0)
    with pytest.raises(NotADirectoryError, match="a symlink, not a folder"):  # a failed write
        posix.stage("linked", "step_3")
    assert [i.tag for i in elsewhere.list_checkpoints("outside")] == ["step_1", "step_2"]


def test_a_manifest_written_elsewhere_is_checked_like_one_written_here(
    posix: CheckpointStore,
) -> None:
    files = {MODEL_FILE: b"w", METADATA_FILE: b'{"step": 4}'}
    write_entry(posix, "exp", "step_4", {**files, MANIFEST_FILE: manifest_of(files)})
    assert posix.get("exp", "step_4").step == 4


# --- stages joined by other writers (the ranks of a sharded save) ---


def test_files_of_a_joined_stage_commit_with_the_owners_as_one_checkpoint(
    store: CheckpointStore,
) -> None:
    owner = store.stage("exp", "step_1")
    other = store.join("exp", "step_1", owner.key)  # another rank, with the key it was sent
    other.write("rank-1.safetensors", b"rank one")
    with pytest.raises(RuntimeError, match="only"):
        other.commit()
    owner.write("rank-0.safetensors", b"rank zero")
    owner.write(METADATA_FILE, json.dumps({"step": 1}).encode())
    assert tags(store, "exp") == []  # nothing visible before the owner commits
    owner.adopt(other.listing({}))
    owner.commit(layout="dcp")

    info = store.get("exp", "step_1")
    assert info.sharded
    assert {f["name"] for f in info.files} == {"rank-0.safetensors", "rank-1.safetensors",
                                               METADATA_FILE}  # fmt: skip
    assert served(store, "exp", "step_1", "rank-1.safetensors") == b"rank one"


def test_a_stage_that_is_not_there_cannot_be_joined_and_an_aborted_one_leaves_nothing(
    store: CheckpointStore,
) -> None:
    owner = store.stage("exp", "step_1")
    other = store.join("exp", "step_1", owner.key)
    other.write("rank-1.safetensors", b"rank one")
    owner.abort()  # rank 0 saw a rank die before the gather
    assert tags(store, "exp") == []
    if not isinstance(store.storage, S3Storage):  # a bucket has no record of its stages
        with pytest.raises(FileNotFoundError):
            store.join("exp", "step_1", owner.key)

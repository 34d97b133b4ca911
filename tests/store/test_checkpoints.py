"""The checkpoint store, exercised with small fake checkpoints (no torch)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import trainctl.store.checkpoints.store as checkpoints_module
from trainctl.store.checkpoints.manifests import (
    MANIFEST_FILE,
    METADATA_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    open_fd,
    verify_manifest,
    write_manifest,
)
from trainctl.store.checkpoints.store import STAGING_PREFIX, TRASH_PREFIX, CheckpointStore
from trainctl.store.exceptions import (
    CheckpointCorrupt,
    CheckpointNotFound,
    CheckpointProtected,
    InvalidName,
    InvalidRequest,
)
from trainctl.store.names import BEST_TAG, parse_step, step_tag, validate_name


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "checkpoints")


def save(
    store: CheckpointStore,
    experiment: str,
    tag: str | None = None,
    *,
    step: int = 0,
    best_loss: float | None = None,
    created_at: str | None = None,
    weights: bytes = b"weights",
) -> Path:
    """Write a fake checkpoint the way the worker does: stage, manifest last, commit."""
    staging = store.staging_dir(experiment, tag or step_tag(step))
    (staging / MODEL_FILE).write_bytes(weights)
    (staging / OPTIMIZER_FILE).write_bytes(b"optimizer state")
    metadata: dict[str, Any] = {"step": step, "token_count": step * 1000, "run_id": "run-1"}
    metadata.update(best_loss=best_loss, created_at=created_at)
    (staging / METADATA_FILE).write_text(json.dumps(metadata))
    write_manifest(staging, [MODEL_FILE, OPTIMIZER_FILE, METADATA_FILE])
    return store.commit(staging, experiment, tag or step_tag(step))


def tags(store: CheckpointStore, experiment: str | None = None) -> list[str]:
    return [i.tag for i in store.list_checkpoints(experiment)]


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
        store.staging_dir("exp", "latest")


# --- manifests ---


def test_write_manifest_records_name_size_and_hash(tmp_path: Path) -> None:
    (tmp_path / MODEL_FILE).write_bytes(b"abc")
    manifest = write_manifest(tmp_path, [MODEL_FILE])
    assert manifest == json.loads((tmp_path / MANIFEST_FILE).read_text())
    entry = manifest["files"][0]
    assert manifest["version"] == 1
    assert entry["name"] == MODEL_FILE and entry["size"] == 3
    assert entry["sha256"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert verify_manifest(tmp_path) == manifest


def test_write_manifest_uses_precomputed_hashes(tmp_path: Path) -> None:
    (tmp_path / MODEL_FILE).write_bytes(b"abc")
    manifest = write_manifest(tmp_path, [MODEL_FILE], hashes={MODEL_FILE: "0" * 64})
    assert manifest["files"][0]["sha256"] == "0" * 64


def test_write_manifest_refuses_names_that_are_not_plain_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidName):
        write_manifest(tmp_path, ["../escape"])


def test_verify_manifest_detects_a_flipped_byte_only_when_deep(
    store: CheckpointStore,
) -> None:
    folder = save(store, "exp", step=1, weights=b"\x00" * 64)
    (folder / MODEL_FILE).write_bytes(b"\x00" * 63 + b"\x01")
    verify_manifest(folder, deep=False)
    with pytest.raises(CheckpointCorrupt, match=f"{MODEL_FILE}: sha256"):
        verify_manifest(folder)


def test_verify_manifest_detects_truncation(store: CheckpointStore) -> None:
    folder = save(store, "exp", step=1)
    with open(folder / OPTIMIZER_FILE, "r+b") as f:
        f.truncate(3)
    with pytest.raises(CheckpointCorrupt, match=f"{OPTIMIZER_FILE}: size 3 bytes"):
        verify_manifest(folder, deep=False)


def test_verify_manifest_rejects_a_missing_or_hostile_manifest(tmp_path: Path) -> None:
    with pytest.raises(CheckpointCorrupt, match="missing"):
        verify_manifest(tmp_path)
    hostile = {"version": 1, "files": [{"name": "../x", "size": 0, "sha256": "0" * 64}]}
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(hostile))
    with pytest.raises(CheckpointCorrupt, match="bad or duplicate"):
        verify_manifest(tmp_path)


# --- listing ---


def test_only_complete_checkpoints_are_listed_or_latest(store: CheckpointStore) -> None:
    save(store, "exp", step=1)
    exp = store.experiment_dir("exp")
    for step in (2, 3, 4, 5):
        save(store, "exp", step=step)
    (exp / "step_2" / MANIFEST_FILE).unlink()  # crashed before the manifest
    (exp / "step_3" / MODEL_FILE).unlink()  # file lost after the manifest
    (exp / "step_4" / OPTIMIZER_FILE).write_bytes(b"short")  # wrong size
    (exp / "step_5" / METADATA_FILE).write_text("{not json")
    staging = store.staging_dir("exp", "step_9")  # a save in progress
    (staging / METADATA_FILE).write_text('{"step": 9}')
    write_manifest(staging, [METADATA_FILE])
    (exp / "loose-file").write_text("not a checkpoint")

    assert tags(store) == ["step_1"]
    assert store.latest("exp").tag == "step_1"
    with pytest.raises(CheckpointNotFound):
        store.get("exp", "step_4")


def test_symlinked_checkpoint_folders_are_not_listed(
    store: CheckpointStore, tmp_path: Path
) -> None:
    folder = save(store, "exp", step=1)
    os.symlink(folder, store.experiment_dir("exp") / "step_2")
    assert tags(store) == ["step_1"]


def test_list_sorts_by_experiment_then_step_with_user_tags_last(
    store: CheckpointStore,
) -> None:
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


def test_get_names_a_missing_experiment_or_tag(store: CheckpointStore) -> None:
    with pytest.raises(CheckpointNotFound, match="experiment 'nope' does not exist"):
        store.get("nope", "step_1")
    save(store, "exp", step=1)
    with pytest.raises(CheckpointNotFound, match="'step_2' in experiment 'exp'"):
        store.get("exp", "step_2")


def test_experiments_lists_only_visible_folders(store: CheckpointStore) -> None:
    assert store.experiments() == []
    save(store, "b", step=1)
    save(store, "a", step=1)
    (store.root / ".hidden").mkdir()
    assert store.experiments() == ["a", "b"]


# --- latest and best ---


def test_latest_is_the_highest_step_not_the_newest_mtime(store: CheckpointStore) -> None:
    save(store, "exp", step=200)
    newer = save(store, "exp", step=100)
    save(store, "exp", "user-tag", step=500)
    os.utime(newer / MANIFEST_FILE, (2e9, 2e9))
    assert store.latest("exp").tag == "step_200"
    assert store.resolve("exp", "latest").tag == "step_200"


def test_latest_across_experiments_is_the_most_recently_created(
    store: CheckpointStore,
) -> None:
    save(store, "a", step=900, created_at="2025-01-01T00:00:00+00:00")
    save(store, "b", step=5, created_at="2025-03-01T00:00:00Z")
    save(store, "c", step=50, created_at="2025-02-01T00:00:00")
    assert (store.latest().experiment, store.latest().tag) == ("b", "step_5")


def test_latest_across_experiments_falls_back_to_mtime_without_created_at(
    store: CheckpointStore,
) -> None:
    older = save(store, "a", step=900)
    newer = save(store, "b", step=5)
    os.utime(older / MANIFEST_FILE, (1e9, 1e9))
    os.utime(newer / MANIFEST_FILE, (2e9, 2e9))
    assert store.latest().experiment == "b"


def test_latest_without_checkpoints_says_so(store: CheckpointStore) -> None:
    with pytest.raises(CheckpointNotFound, match="no checkpoints yet"):
        store.latest()
    store.staging_dir("exp", "step_1")
    with pytest.raises(CheckpointNotFound, match="no checkpoint for experiment 'exp' yet"):
        store.latest("exp")
    assert store.latest_or_none("exp") is None


def test_best_of_an_experiment_and_across_experiments(store: CheckpointStore) -> None:
    save(store, "a", BEST_TAG, step=10, best_loss=3.0)
    save(store, "b", BEST_TAG, step=20, best_loss=2.0)
    save(store, "c", step=30, best_loss=1.0)  # not tagged best
    assert store.best("a").best_loss == 3.0
    assert store.resolve("a", "best").step == 10
    assert store.best().experiment == "b"
    with pytest.raises(CheckpointNotFound):
        store.best("c")


# --- commit and cleanup ---


def test_commit_replaces_an_existing_tag_and_leaves_no_trash(store: CheckpointStore) -> None:
    save(store, "exp", BEST_TAG, step=1, best_loss=3.0)
    save(store, "exp", BEST_TAG, step=2, best_loss=2.0)
    assert store.best("exp").step == 2
    assert sorted(p.name for p in store.experiment_dir("exp").iterdir()) == [BEST_TAG]


def test_commit_refuses_a_staging_folder_without_a_valid_manifest(
    store: CheckpointStore,
) -> None:
    staging = store.staging_dir("exp", "step_1")
    (staging / MODEL_FILE).write_bytes(b"w")
    with pytest.raises(CheckpointCorrupt):
        store.commit(staging, "exp", "step_1")
    assert tags(store) == []


def test_cleanup_removes_staging_and_restores_an_orphaned_trash(
    store: CheckpointStore,
) -> None:
    folder = save(store, "exp", BEST_TAG, step=1, best_loss=1.0)
    save(store, "exp", step=2)
    exp = store.experiment_dir("exp")
    staging = store.staging_dir("exp", "step_3")
    orphan = exp / f"{TRASH_PREFIX}{BEST_TAG}-{'a' * 32}"
    os.rename(folder, orphan)  # a crash between commit's two renames
    stale = exp / f"{TRASH_PREFIX}step_2-{'b' * 32}"
    stale.mkdir()  # step_2 is in place, so this trash is a leftover

    handled = store.cleanup()

    assert set(handled) == {staging, orphan, stale}
    assert sorted(p.name for p in exp.iterdir()) == [BEST_TAG, "step_2"]
    assert store.best("exp").step == 1


def test_cleanup_never_resurrects_a_deleted_checkpoint(store: CheckpointStore) -> None:
    save(store, "exp", step=1)
    exp = store.experiment_dir("exp")
    os.rename(exp / "step_1", exp / f"{TRASH_PREFIX}{'c' * 32}")  # crash inside delete
    store.cleanup("exp")
    assert list(exp.iterdir()) == []


def test_staging_folders_are_hidden_and_unique(store: CheckpointStore) -> None:
    first = store.staging_dir("exp", "step_1")
    second = store.staging_dir("exp", "step_1")
    assert first != second
    assert first.name.startswith(STAGING_PREFIX + "step_1-")


# --- delete, prune, retain ---


def test_delete_removes_the_folder_and_returns_what_it_was(store: CheckpointStore) -> None:
    save(store, "exp", step=1)
    assert store.delete("exp", "step_1").tag == "step_1"
    assert list(store.experiment_dir("exp").iterdir()) == []
    with pytest.raises(CheckpointNotFound):
        store.delete("exp", "step_1")


def test_delete_refuses_a_protected_checkpoint(store: CheckpointStore) -> None:
    save(store, "exp", step=1)
    with pytest.raises(CheckpointProtected, match="in use by a queued or running run"):
        store.delete("exp", "step_1", protected={("exp", "step_1")})
    assert tags(store) == ["step_1"]


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


def test_prune_rejects_a_negative_keep_last(store: CheckpointStore) -> None:
    save(store, "exp", step=1)
    with pytest.raises(InvalidRequest, match="keep_last"):
        store.prune("exp", keep_last=-1)


def test_retain_keeps_max_keep_steps_and_returns_the_deleted(store: CheckpointStore) -> None:
    for step in (10, 20, 30, 40):
        save(store, "exp", step=step)
    save(store, "exp", BEST_TAG, step=10, best_loss=0.5)
    deleted = store.retain("exp", max_keep=2)
    # `best` is its own copy, so the step it came from is not kept on its account.
    assert sorted(i.tag for i in deleted) == ["step_10", "step_20"]
    assert sorted(tags(store)) == [BEST_TAG, "step_30", "step_40"]


# --- safe file resolution ---


def served(store: CheckpointStore, experiment: str, tag: str, name: str) -> bytes:
    _, fd = store.open_file(experiment, tag, name)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def test_open_file_serves_manifest_listed_files_and_the_manifest(
    store: CheckpointStore,
) -> None:
    folder = save(store, "exp", step=1)
    for name in (MODEL_FILE, MANIFEST_FILE):
        assert served(store, "exp", "step_1", name) == (folder / name).read_bytes()


HOSTILE_NAMES = [
    "../x", "..", ".", "%2e%2e/x", "%2e%2e", "/etc/passwd", "a\\b", "x\x00y",
    "manifest.json/../../x", "", "MODEL.SAFETENSORS", " model.safetensors", "extra.bin",
]  # fmt: skip


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_open_file_refuses_hostile_names(store: CheckpointStore, name: str) -> None:
    folder = save(store, "exp", step=1)
    (folder / "extra.bin").write_bytes(b"present on disk but not in the manifest")
    with pytest.raises((InvalidName, CheckpointNotFound)):
        store.open_file("exp", "step_1", name)


@pytest.mark.parametrize(("experiment", "tag"), [("..", "step_1"), ("exp", "../exp")])
def test_open_file_refuses_hostile_experiment_and_tag(
    store: CheckpointStore, experiment: str, tag: str
) -> None:
    save(store, "exp", step=1)
    with pytest.raises(InvalidName):
        store.open_file(experiment, tag, MODEL_FILE)


# --- links planted in a shared store: never followed, by any reader --------------------------


def plant_link(folder: Path, name: str, target: Path) -> None:
    """Replace `name` in `folder` by a link to `target`, a file of the same size, so that a
    check of sizes alone would not notice."""
    target.write_bytes(b"s" * (folder / name).stat().st_size)
    (folder / name).unlink()
    os.symlink(target, folder / name)


@pytest.mark.parametrize("name", [MODEL_FILE, OPTIMIZER_FILE, METADATA_FILE, MANIFEST_FILE])
def test_a_checkpoint_with_a_file_that_is_a_link_is_invisible_to_every_reader(
    store: CheckpointStore, tmp_path: Path, name: str
) -> None:
    save(store, "exp", step=1)
    folder = save(store, "exp", step=2)
    plant_link(folder, name, tmp_path / "secret")

    assert tags(store, "exp") == ["step_1"]
    assert store.latest("exp").tag == "step_1"
    with pytest.raises(CheckpointNotFound):
        store.get("exp", "step_2")
    with pytest.raises(CheckpointNotFound):
        store.open_file("exp", "step_2", name)
    with pytest.raises(CheckpointCorrupt, match="missing"):
        verify_manifest(folder, deep=True)


def test_a_link_swapped_in_after_the_listing_is_still_not_followed(
    store: CheckpointStore, tmp_path: Path
) -> None:
    folder = save(store, "exp", step=1)
    info = store.get("exp", "step_1")  # complete when listed...
    plant_link(folder, MODEL_FILE, tmp_path / "secret")  # ...a link a moment later
    with pytest.raises(FileNotFoundError, match="not a regular file"):
        open_fd(info.path, MODEL_FILE)


def test_a_tag_or_experiment_folder_that_is_a_link_is_neither_listed_read_nor_pruned(
    store: CheckpointStore, tmp_path: Path
) -> None:
    elsewhere = CheckpointStore(tmp_path / "elsewhere")
    save(elsewhere, "outside", step=1)
    save(elsewhere, "outside", step=2)
    save(store, "exp", step=1)
    outside = elsewhere.experiment_dir("outside")
    os.symlink(outside, store.experiment_dir("linked"))
    os.symlink(outside / "step_2", store.experiment_dir("exp") / "step_9")

    assert [(i.experiment, i.tag) for i in store.list_checkpoints()] == [("exp", "step_1")]
    assert store.list_checkpoints("linked") == []
    assert store.latest_or_none("linked") is None
    assert store.latest("exp").tag == "step_1"
    for experiment, tag in [("linked", "step_1"), ("exp", "step_9")]:
        with pytest.raises(CheckpointNotFound):
            store.get(experiment, tag)
    with pytest.raises(CheckpointNotFound):
        store.prune("linked", keep_last=0)
    with pytest.raises(CheckpointCorrupt, match="symlink"):
        store.staging_dir("linked", "step_3")
    assert [i.tag for i in elsewhere.list_checkpoints("outside")] == ["step_1", "step_2"]


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
    folder = save(store, "exp", step=2)
    (folder / name).write_bytes(content)

    assert tags(store) == ["step_1"]
    assert store.latest().tag == "step_1"
    with pytest.raises(CheckpointNotFound):
        store.get("exp", "step_2")


def test_latest_of_an_experiment_reads_only_the_newest_folders(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in range(1, 31):
        save(store, "exp", step=step)
    (store.experiment_dir("exp") / "step_30" / MANIFEST_FILE).unlink()  # a crashed save
    read: list[str] = []
    real = checkpoints_module._load_info

    def counting(experiment: str, tag: str, folder: Path) -> Any:
        read.append(tag)
        return real(experiment, tag, folder)

    monkeypatch.setattr(checkpoints_module, "_load_info", counting)
    assert store.latest("exp").tag == "step_29"
    assert read == ["step_30", "step_29"]  # not all 30: this is the most polled read


def test_a_hidden_bad_folder_is_reported_once_in_the_log(
    store: CheckpointStore, caplog: pytest.LogCaptureFixture
) -> None:
    folder = save(store, "exp", step=2)
    (folder / MANIFEST_FILE).write_text("{not json")

    with caplog.at_level("WARNING", logger="trainctl.store.checkpoints.store"):
        for _ in range(3):
            assert store.list_checkpoints("exp") == []

    [record] = [r for r in caplog.records if "not listing" in r.getMessage()]
    assert str(folder) in record.getMessage() and "cannot be read as JSON" in record.getMessage()

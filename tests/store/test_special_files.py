"""What can be planted in a shared checkpoint filesystem besides links (docs/design/checkpoints.md,
"Checkpoint store", "No links, bounded reads"): FIFOs, sockets, hardlinks to files outside
the store, and folders swapped for links under a writer. Each is missing, never read, never
waited on, and nothing is renamed, made or removed outside the store."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.special_files import plant, without_blocking
from tests.support.stores import folder, manifest_of, posix_store, write_entry
from trainctl.store.checkpoints.manifests import (
    MANIFEST_FILE,
    METADATA_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    verify_manifest,
)
from trainctl.store.checkpoints.posix import GUARD_PREFIX, PosixStorage
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.exceptions import CheckpointCorrupt, CheckpointNotFound

SECRET = b"a file outside the store, which only the service can read " * 20


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return posix_store(tmp_path / "checkpoints")


def files(step: int, weights: bytes = b"weights " * 100) -> dict[str, bytes]:
    """A checkpoint's files and the manifest that lists their true sizes and hashes."""
    metadata = {"step": step, "token_count": step, "run_id": "run-1", "best_loss": None}
    found = {
        MODEL_FILE: weights,
        OPTIMIZER_FILE: b"state",
        METADATA_FILE: json.dumps(metadata).encode(),
    }
    return {**found, MANIFEST_FILE: manifest_of(found)}


def save(store: CheckpointStore, step: int, weights: bytes = b"weights " * 100) -> Path:
    write_entry(store, "exp", f"step_{step}", files(step, weights))
    return folder(store, "exp", f"step_{step}")


def listed(store: CheckpointStore) -> list[str]:
    return without_blocking(lambda: [i.tag for i in store.list_checkpoints("exp")], "listing")


@pytest.mark.parametrize("kind", ["fifo", "socket"])
@pytest.mark.parametrize("name", [MODEL_FILE, OPTIMIZER_FILE, METADATA_FILE, MANIFEST_FILE])
def test_a_fifo_or_socket_in_a_checkpoint_is_missing_and_no_reader_waits_on_it(
    store: CheckpointStore, name: str, kind: str
) -> None:
    save(store, 1)
    plant(save(store, 2) / name, kind)

    assert listed(store) == ["step_1"]
    assert without_blocking(lambda: store.latest("exp").tag, "latest") == "step_1"
    with pytest.raises(CheckpointNotFound):
        without_blocking(lambda: store.get("exp", "step_2"), "a point read")
    with pytest.raises(CheckpointNotFound):
        without_blocking(lambda: store.open_file("exp", "step_2", name), "a download")
    with pytest.raises(CheckpointCorrupt, match="missing"):
        without_blocking(lambda: verify_manifest(store.entry("exp", "step_2")), "a load's check")


def test_a_hardlink_to_a_file_outside_the_store_is_missing_though_the_manifest_lists_it(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """The manifest lists the outside file's true size and sha256, so only its second name
    gives it away."""
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    checkpoint = save(store, 2, weights=SECRET)  # a manifest with the secret's size and hash
    plant(checkpoint / MODEL_FILE, "hardlink", secret)

    assert listed(store) == []
    with pytest.raises(CheckpointNotFound):
        store.open_file("exp", "step_2", MODEL_FILE)
    with pytest.raises(FileNotFoundError, match="hardlink"):
        store.entry("exp", "step_2").open(MODEL_FILE)


def test_the_store_never_makes_a_hardlink_itself(store: CheckpointStore) -> None:
    """Writes, replacing commits and best-as-its-own-copy: every file has one name."""
    save(store, 1)
    write_entry(store, "exp", "best", files(1))
    write_entry(store, "exp", "step_1", files(1, b"replaced"))
    names = [p for p in folder(store, "exp").rglob("*") if p.is_file()]
    assert names and all(p.stat().st_nlink == 1 for p in names)
    assert sorted(listed(store)) == ["best", "step_1"]


def test_a_delete_never_follows_an_experiment_folder_swapped_for_a_link(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """The store checks the folder is real, then the storage renames: a link swapped in
    between must not make it rename and remove a folder outside the store."""
    outside = posix_store(tmp_path / "outside")
    write_entry(outside, "victim", "step_1", files(1))
    save(store, 1)
    exp = folder(store, "exp")
    os.rename(exp, tmp_path / "moved-away")
    os.symlink(folder(outside, "victim"), exp)  # after the store's check, before the rename

    assert store.storage.delete("exp", "step_1") is False
    assert [i.tag for i in outside.list_checkpoints("victim")] == ["step_1"]


def test_a_save_never_writes_through_an_experiment_folder_swapped_for_a_link(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """A stage holds the experiment folder it made: a link swapped in while it writes turns
    neither its files nor its commit elsewhere."""
    outside = tmp_path / "outside"
    outside.mkdir()
    staged = store.storage.stage("exp", "step_1")
    exp = folder(store, "exp")
    os.rename(exp, tmp_path / "moved-away")
    os.symlink(outside, exp)

    for name, data in files(1).items():
        sink = staged.create(name)
        sink.write(data)
        sink.close()
    staged.commit()

    assert list(outside.iterdir()) == []
    assert (tmp_path / "moved-away" / "step_1" / MANIFEST_FILE).is_file()


def test_a_link_planted_at_a_guard_file_is_refused_and_makes_no_file_where_it_points(
    store: CheckpointStore, tmp_path: Path
) -> None:
    storage = store.storage
    assert isinstance(storage, PosixStorage)
    storage.root.mkdir(parents=True)
    target = tmp_path / "elsewhere" / "made-by-the-service"
    target.parent.mkdir()
    os.symlink(target, storage.root / f"{GUARD_PREFIX}exp")

    with pytest.raises(CheckpointCorrupt, match="is a link"), storage.guard("exp"):
        pass

    assert not target.exists()


def test_a_fifo_planted_at_a_guard_file_is_refused_without_waiting(
    store: CheckpointStore,
) -> None:
    storage = store.storage
    assert isinstance(storage, PosixStorage)
    storage.root.mkdir(parents=True)
    plant(storage.root / f"{GUARD_PREFIX}exp", "fifo")

    def take_guard() -> None:
        with storage.guard("exp"):
            pass

    with pytest.raises(CheckpointCorrupt, match="a FIFO, not a regular file"):
        without_blocking(take_guard, "the guard")

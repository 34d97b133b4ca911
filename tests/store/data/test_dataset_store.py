"""The dataset store over the storages the stores use (store.data.bucket.DatasetStore): a data
dir's datasets (POSIX, each committed by its dataset.json, moved in by a rename) and a
storage's entries committed by a manifest (memory here; S3 in test_bucket_datasets.py) read
alike, datasets prepared before the store read as they lie, and what a data dir's folder
holds read without following a link planted there."""

from __future__ import annotations

import os
import shutil
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from tests.support.datasets import stdlib_texts, train_tokenizer, write_bpe_dataset
from tests.support.stores import dataset_store
from trainctl.store.checkpoints.memory import MemoryStorage
from trainctl.store.checkpoints.posix import PosixStorage
from trainctl.store.data.bucket import DATASETS, DatasetStore, NoSuchDataset
from trainctl.store.data.contents import dataset_arrays
from trainctl.store.data.datasets import DATASET_FILE, TOKENIZER_FILE, Dataset, read_dataset
from trainctl.store.data.pins import data_plan
from trainctl.store.data.shards import DataError, read_shard
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.plans import DatasetPin
from trainctl.store.specs import DataSpec

TEXTS = stdlib_texts(60_000)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok") / TOKENIZER_FILE, TEXTS, 300)


@pytest.fixture
def prepared(tmp_path: Path, tokenizer: Path) -> Dataset:
    """A finished dataset folder, as a prepare leaves it before publishing it."""
    return write_bpe_dataset(tmp_path / "prepared" / "code", tokenizer, TEXTS, val_docs=3)


def tokens(dataset: Dataset) -> list[np.ndarray]:
    return [read_shard(p) for split in ("train", "val") for p in dataset.shard_paths(split)]


def identity(dataset: Dataset) -> dict[str, object]:
    """What a pin records of a dataset, but where it is."""
    return {k: v for k, v in dataset.identity().items() if k != "folder"}


def store_on(backend: str, tmp_path: Path) -> DatasetStore:
    if backend == "data dir":
        return dataset_store(tmp_path / "data")
    return DatasetStore(MemoryStorage())


@pytest.mark.parametrize("backend", ["data dir", "memory"])
def test_a_dataset_published_into_either_storage_reads_back_alike(
    tmp_path: Path, prepared: Dataset, backend: str
) -> None:
    datasets = store_on(backend, tmp_path)
    arrays = dataset_arrays(prepared, "data")
    tokenizer_json = (prepared.folder / TOKENIZER_FILE).read_bytes()

    datasets.publish(prepared.folder, "code")

    listed = datasets.read("code")
    assert identity(listed.dataset) == identity(prepared)
    assert listed.dataset.where == datasets.describe("code")
    assert listed.token_arrays() == arrays
    assert listed.files[TOKENIZER_FILE][1] == prepared.tokenizer.sha256
    assert datasets.tokenizer("code") == tokenizer_json
    (tmp_path / "again").mkdir()
    with pytest.raises(FileExistsError):  # a dataset is never replaced under its pins
        datasets.publish(tmp_path / "again", "code")


def test_a_data_dirs_dataset_is_fetched_through_the_files_it_holds_open(
    tmp_path: Path, prepared: Dataset
) -> None:
    """As a bucket's is through its cache (test_bucket_datasets.py); memory has no file a
    library could map."""
    expected = tokens(prepared)
    datasets = dataset_store(tmp_path / "data")
    datasets.publish(prepared.folder, "code")

    with closing(datasets.fetch("code")) as fetched:
        assert DatasetPin.of(fetched) == DatasetPin.of(datasets.read("code").dataset)
        got = tokens(fetched)
        (tmp_path / "data" / DATASETS / "code" / "train_000000.bin").unlink()  # held open
        got += tokens(fetched)[:1]

    assert all(np.array_equal(a, b) for a, b in zip(got, expected + expected[:1], strict=True))


def test_a_data_dirs_dataset_is_moved_in_as_the_folder_prepare_wrote(
    tmp_path: Path, prepared: Dataset
) -> None:
    """No copy and no manifest: the folder the docs describe, its dataset.json the marker."""
    written = sorted(p.name for p in prepared.folder.iterdir())
    datasets = dataset_store(tmp_path / "data")

    datasets.publish(prepared.folder, "code")

    published = tmp_path / "data" / DATASETS / "code"
    assert not prepared.folder.exists()
    assert sorted(p.name for p in published.iterdir()) == written
    assert DATASET_FILE in written and "manifest.json" not in written
    assert datasets.describe("code") == str(published.resolve())


def test_a_dataset_prepared_before_the_store_is_read_as_it_lies(
    tmp_path: Path, tokenizer: Path
) -> None:
    folder = tmp_path / "data" / DATASETS / "code"
    old = write_bpe_dataset(folder, tokenizer, TEXTS)  # no manifest, as ever
    datasets = dataset_store(tmp_path / "data")

    listed = datasets.read("code")

    assert DatasetPin.of(listed.dataset) == DatasetPin.of(read_dataset(folder.resolve()))
    assert listed.token_arrays() == dataset_arrays(old, "data")
    assert datasets.tokenizer("code") == (folder / TOKENIZER_FILE).read_bytes()


def test_a_hardlinked_shard_is_read_and_a_symlinked_one_is_refused_naming_it(
    tmp_path: Path, tokenizer: Path
) -> None:
    """Hardlinks are another name of a file ("Walks and opens"); a symlink in a data dir's
    dataset was planted, and may lead anywhere."""
    folder = tmp_path / "data" / DATASETS / "code"
    write_bpe_dataset(folder, tokenizer, TEXTS)
    shard = folder / "train_000000.bin"
    kept = tmp_path / "snapshot.bin"
    os.link(shard, kept)
    datasets = dataset_store(tmp_path / "data")

    assert datasets.read("code").token_arrays().train

    shard.unlink()
    shard.symlink_to(kept)
    with pytest.raises(DataError, match=r"'train_000000\.bin'.*a symlink, not a regular file"):
        datasets.read("code")


def test_a_dataset_name_that_is_a_link_in_the_datasets_folder_is_refused_unread(
    tmp_path: Path, prepared: Dataset
) -> None:
    """Prepare runs publish real folders there; a link was planted, and what it points to
    (a dataset.json anywhere) is not read."""
    (tmp_path / "data" / DATASETS).mkdir(parents=True)
    os.symlink(prepared.folder, tmp_path / "data" / DATASETS / "code")
    datasets = dataset_store(tmp_path / "data")

    with pytest.raises(NoSuchDataset, match="no dataset named 'code'"):
        datasets.read("code")
    with pytest.raises(InvalidRequest, match=r"data\.dataset: there is no dataset named 'code'"):
        data_plan(DataSpec(source="dataset", dataset="code"), [], datasets)


def test_a_data_dirs_datasets_folder_may_be_a_link_to_another_disk(
    tmp_path: Path, tokenizer: Path
) -> None:
    """The administrator's link is followed (the storage opens beside its target); links
    below it are not."""
    disk = tmp_path / "disk" / "trainctl-datasets"
    write_bpe_dataset(disk / "code", tokenizer, TEXTS)
    (tmp_path / "data").mkdir()
    os.symlink(disk, tmp_path / "data" / DATASETS)
    datasets = dataset_store(tmp_path / "data")

    assert datasets.read("code").dataset.where == str((disk / "code").resolve())
    assert isinstance(datasets.storage, PosixStorage)


def test_a_missing_shard_and_a_folder_without_dataset_json_are_named(
    tmp_path: Path, prepared: Dataset
) -> None:
    datasets = dataset_store(tmp_path / "data")
    datasets.publish(prepared.folder, "code")
    published = tmp_path / "data" / DATASETS / "code"

    (published / "val_000000.bin").unlink()
    with pytest.raises(DataError, match=r"lists 'val_000000\.bin', which is missing"):
        datasets.read("code")
    shutil.rmtree(published)
    published.mkdir()
    with pytest.raises(DataError, match=r"has no dataset\.json.*prepare has not finished"):
        datasets.read("code")

"""The dataset store (docs/design/data.md, "Datasets"; docs/design/checkpoints.md, "Object
storage"): the prepared datasets of a deployment, entries ``datasets/<name>`` of the storage seam
(`store.checkpoints.storage`) over the storage `open_stores` picks: `PosixStorage` on the data
dir, whose entries are its folders ``datasets/<name>``, or the bucket of TRAINCTL_STORAGE_URL.
(The module keeps the name it had while only a bucket's datasets were entries.)

An entry is committed in one of two ways, and read alike:

- by its manifest, as a checkpoint is: every file uploaded with its sha256, then the
  manifest, the commit marker (`CheckpointWriter`). In an S3 storage under the prefix of
  TRAINCTL_STORAGE_URL that is

  ```
  <prefix>/datasets/<name>/manifest.json           the commit marker: no manifest, no dataset
  <prefix>/datasets/<name>/.<generation>/<file>    dataset.json, tokenizer.json, the shards
  ```

- by its dataset.json, the last file a prepare writes into its folder, the folder then moved
  in whole by one rename (`Storage.adopt`): the data dir's datasets, laid out as
  `store.data.datasets` says, those prepared before this store as those since. No manifest
  vouches for their files, so `read` opens each file dataset.json lists, reads a shard's
  header and hashes the tokenizer: what submit has always checked of a dataset folder.

Submit reads the manifest (or those files' sizes and headers) and dataset.json (`read`): a
shard's token count follows from its size, so the service never downloads a shard. A worker
opens every file (`fetch`), a bucket's through its verified cache, and reads them through
readers it holds open: the cache may evict a file's name meanwhile, never the bytes a run
maps, and a file of a folder swapped after the check is not the one read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from trainctl.store.checkpoints.manifests import MANIFEST_FILE, is_complete, read_manifest
from trainctl.store.checkpoints.storage import Entry, NotAFile, Storage
from trainctl.store.checkpoints.writer import CheckpointWriter
from trainctl.store.data.contents import TokenArrays
from trainctl.store.data.datasets import (
    DATASET_FILE,
    MAX_DATASET_JSON_BYTES,
    MAX_TOKENIZER_BYTES,
    TOKENIZER_FILE,
    Dataset,
    parse_dataset,
)
from trainctl.store.data.shards import SHARD_HEADER_BYTES, DataError, shard_header
from trainctl.store.data.walk import MAX_FILES
from trainctl.store.exceptions import CheckpointCorrupt, InvalidName

DATASETS = "datasets"
"""The storage's experiment that holds the datasets: ``<prefix>/datasets/<name>``."""
_CHUNK = 8 << 20


class NoSuchDataset(DataError):
    """The store has no dataset of the name (or its prepare has not finished)."""


@dataclass(frozen=True)
class Listed:
    """A dataset as its dataset.json says, and its files, read without its shards' tokens."""

    dataset: Dataset
    files: dict[str, tuple[int, str | None]]
    """(size, sha256) of each file, by name: as its manifest lists them, or as they were
    opened (a shard's sha256 is then None: nothing records it, and nothing reads it whole)."""

    def token_arrays(self) -> TokenArrays:
        """The tokens of each non-empty shard of both splits, from the shards' sizes."""
        itemsize = np.dtype(self.dataset.token_dtype).itemsize
        splits = []
        for split in ("train", "val"):
            lengths = []
            for name in self.dataset.splits[split].shards:
                size = self.size(name) - SHARD_HEADER_BYTES
                if size < 0 or size % itemsize:
                    raise DataError(f"{name}: {size + SHARD_HEADER_BYTES} bytes is not a shard")
                lengths.append(size // itemsize)
            splits.append([n for n in lengths if n])
        return TokenArrays(splits[0], splits[1])

    def size(self, name: str) -> int:
        if name not in self.files:
            raise DataError(f"its dataset.json lists {name!r}, which its manifest does not")
        return self.files[name][0]


class DatasetStore:
    """The prepared datasets of a storage: a data dir's folders, or a bucket's entries.
    `open_stores` builds it, over the storage that holds the checkpoints."""

    def __init__(self, storage: Storage, experiment: str = DATASETS) -> None:
        """`experiment`: the storage's folder of datasets (a data dir's `datasets/` may be a
        link to a folder of another name, which the storage is then opened beside)."""
        self.storage, self.experiment = storage, experiment

    def describe(self, name: str | None = None) -> str:
        return self.storage.describe(self.experiment, name)

    def name_of(self, ref: str) -> str | None:
        """The dataset `ref` names here: a bare name, or this store's name of one (a plan's
        pin: its folder or URL); None for a folder path elsewhere, which is read where it
        lies."""
        top = self.describe() + "/"
        if ref.startswith(top):
            return ref[len(top) :]
        return None if "/" in ref else ref

    def exists(self, name: str) -> bool:
        return self.storage.exists(self.experiment, name)

    def cleanup(self) -> list[tuple[str, str]]:
        """What prepares killed mid-upload left (files no manifest names, unfinished
        multipart uploads), swept as the checkpoint store sweeps its own: at start, before
        workers run. Returns (experiment, the storage's name for it), as that does."""
        return self.storage.cleanup(self.experiment, is_complete)

    def publish(self, folder: Path, name: str) -> None:
        """Publish the finished dataset in `folder` as `name`: moved in as it is where the
        storage takes a folder (a data dir: one rename, its dataset.json the commit marker),
        else uploaded, its manifest last. FileExistsError when `name` is published already
        (a dataset is never replaced under its pins)."""
        if self.storage.adopt(self.experiment, name, folder):
            return
        with CheckpointWriter(self.storage.stage(self.experiment, name)) as writer:
            hashes = {}
            for path in sorted(folder.iterdir()):
                hashes[path.name] = _upload(path, writer)
            writer.commit(hashes, replace=False)

    def read(self, name: str) -> Listed:
        """Its dataset.json, and its files as its manifest lists them or, without one, as
        they are; NoSuchDataset when it is not here, DataError naming what else is wrong."""
        entry = Entry(self.storage, self.experiment, name)
        manifest = self._manifest(entry, name)
        if manifest is None:  # committed by its dataset.json: a prepare's folder
            dataset = self._dataset(entry, name, listed=False)
            return Listed(dataset, _opened_files(entry, dataset))
        files = {f["name"]: (f["size"], f["sha256"]) for f in manifest["files"]}
        if DATASET_FILE not in files:
            raise DataError(f"{self.describe(name)}: its manifest lists no {DATASET_FILE}")
        return Listed(self._dataset(entry, name, listed=True), files)

    def _manifest(self, entry: Entry, name: str) -> dict[str, Any] | None:
        """The entry's manifest; None where it has none (a folder committed by its
        dataset.json); NoSuchDataset where there is no entry."""
        try:
            return read_manifest(entry)
        except CheckpointCorrupt as exc:
            if not self.exists(name):
                raise NoSuchDataset(
                    f"there is no dataset named {name!r} in {self.describe()} (POST "
                    "/runs/prepare makes one, or its prepare has not finished)"
                ) from None
            if _has(entry, MANIFEST_FILE):
                raise DataError(str(exc)) from None
            return None

    def _dataset(self, entry: Entry, name: str, *, listed: bool) -> Dataset:
        where = entry.describe(DATASET_FILE)
        try:
            with entry.open(DATASET_FILE) as f:
                raw = f.read(MAX_DATASET_JSON_BYTES + 1)
        except FileNotFoundError as exc:
            if listed or not _is_missing(exc):
                raise DataError(f"{_reason(where, exc)}; prepare it again") from None
            raise DataError(
                f"{entry.describe()} has no {DATASET_FILE}: not a prepared dataset, or its "
                "prepare has not finished (wait for it, or prepare it again)"
            ) from None
        folder = Path(self.experiment, name)
        return parse_dataset(raw, folder, where, location=self.describe(name))

    def tokenizer(self, name: str) -> bytes:
        """Its tokenizer.json, as the storage holds it (a bucket's as the cache checked it
        against the manifest), bounded."""
        entry = Entry(self.storage, self.experiment, name)
        where = entry.describe(TOKENIZER_FILE)
        try:
            with entry.open(TOKENIZER_FILE) as f:
                data = f.read(MAX_TOKENIZER_BYTES + 1)
        except FileNotFoundError as exc:
            raise DataError(f"{_reason(where, exc)}; prepare it again") from None
        if len(data) > MAX_TOKENIZER_BYTES:
            raise DataError(f"{where}: too large for a tokenizer.json")
        return data

    def fetch(self, name: str) -> Dataset:
        """The dataset with every file open (a bucket's downloaded into the local cache and
        checked against its manifest), and held open (`Dataset.held`): read it through
        `Dataset.path`."""
        listed = self.read(name)
        entry = Entry(self.storage, self.experiment, name)
        held: list[Any] = []
        paths = {}
        try:
            for file in listed.files:
                reader = _open(entry, file)
                held.append(reader)
                if reader.local_path is None:  # the cache keeps only what matches the manifest
                    raise DataError(
                        f"{entry.describe(file)}: not the file its manifest lists (size or "
                        "sha256 differs); prepare the dataset again"
                    )
                paths[file] = reader.local_path
        except BaseException:
            for reader in held:
                reader.close()
            raise
        return replace(listed.dataset, paths=paths, held=tuple(held))


def _opened_files(entry: Entry, dataset: Dataset) -> dict[str, tuple[int, str | None]]:
    """(size, sha256) of each file of a dataset that no manifest lists, each opened as the
    storage opens files (regular, no link followed), a shard's header checked and the
    tokenizer hashed: what submit checks of any dataset folder."""
    shards = [name for split in dataset.splits.values() for name in split.shards]
    if len(shards) + 2 > MAX_FILES:
        raise DataError(f"its {DATASET_FILE} names more than {MAX_FILES:,} files")
    files: dict[str, tuple[int, str | None]] = {}
    for name in shards:
        with _open(entry, name) as f:
            found, _ = shard_header(f.read(SHARD_HEADER_BYTES), f.size, entry.describe(name))
            if found != np.dtype(dataset.token_dtype):
                raise DataError(
                    f"{entry.describe(name)} holds {found} tokens, but its {DATASET_FILE} says "
                    f"{dataset.token_dtype}; prepare the dataset again"
                )
            files[name] = (f.size, None)
    if dataset.tokenizer.kind == "bpe":
        with _open(entry, TOKENIZER_FILE) as f:
            data = f.read(MAX_TOKENIZER_BYTES + 1)
            files[TOKENIZER_FILE] = (f.size, hashlib.sha256(data).hexdigest())
    with _open(entry, DATASET_FILE) as f:
        files[DATASET_FILE] = (f.size, None)
    return files


def _open(entry: Entry, name: str) -> Any:
    """A reader of a file its dataset.json or manifest lists; DataError saying why not."""
    try:
        return entry.open(name)
    except InvalidName:
        raise DataError(f"its {DATASET_FILE} lists {name!r}, which is no file name") from None
    except FileNotFoundError as exc:
        if _is_missing(exc):
            raise DataError(
                f"its {DATASET_FILE} lists {name!r}, which is missing; prepare it again"
            ) from None
        raise DataError(
            f"its file {name!r}: {_reason(entry.describe(name), exc)} (a dataset is read from "
            "files of its own, never through a link, which may lead outside the data roots); "
            "prepare it again"
        ) from None


def _has(entry: Entry, name: str) -> bool:
    try:
        entry.open(name).close()
    except FileNotFoundError:
        return False
    return True


def _is_missing(exc: FileNotFoundError) -> bool:
    """Whether there is nothing at the name, rather than what a storage never reads as a
    file (`NotAFile`: a link, a FIFO), which is missing to it too."""
    return not isinstance(exc, NotAFile)


def _reason(where: str, exc: FileNotFoundError) -> str:
    """Why a file cannot be read, naming it once."""
    text = str(exc)
    return text if where in text else f"{where}: {text}"


def _upload(path: Path, writer: CheckpointWriter) -> str:
    """One file of a finished dataset into the stage; its sha256."""
    digest = hashlib.sha256()
    sink = writer.create(path.name)
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            sink.write(chunk)
    sink.close()
    return digest.hexdigest()

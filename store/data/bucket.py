"""Prepared datasets in a bucket (docs/design/checkpoints.md, "Object storage"): what nodes that
share no disk read a dataset from, when TRAINCTL_STORAGE_URL is set.

A dataset is an entry of the storage seam (`store.checkpoints.storage`), ``datasets/<name>``,
written as a checkpoint is: every file of the finished folder uploaded with its sha256, then
the manifest, the commit marker (`CheckpointWriter`). In an S3 storage under the prefix of
TRAINCTL_STORAGE_URL that is

```
<prefix>/datasets/<name>/manifest.json           the commit marker: no manifest, no dataset
<prefix>/datasets/<name>/.<generation>/<file>    dataset.json, tokenizer.json, the shards
```

Submit reads the manifest and dataset.json alone (`read`): a shard's token count follows
from its size in the manifest, so the service never downloads the shards. A worker
downloads every file into its verified cache (`fetch`) and reads them through readers it
holds open: the cache may evict a file's name meanwhile, never the bytes a run maps.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from trainctl.store.checkpoints.manifests import is_complete, read_manifest
from trainctl.store.checkpoints.storage import Entry, Storage
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
from trainctl.store.data.shards import SHARD_HEADER_BYTES, DataError
from trainctl.store.exceptions import CheckpointCorrupt

DATASETS = "datasets"
"""The storage's experiment that holds the datasets: ``<prefix>/datasets/<name>``."""
_CHUNK = 8 << 20


@dataclass(frozen=True)
class Listed:
    """A dataset as its manifest and dataset.json say, read without its shards."""

    dataset: Dataset
    files: dict[str, tuple[int, str]]
    """(size, sha256) of each file, by name."""

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


class BucketDatasets:
    """The datasets of a storage (in practice the bucket of TRAINCTL_STORAGE_URL)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def describe(self, name: str | None = None) -> str:
        return self.storage.describe(DATASETS, name)

    def name_of(self, ref: str) -> str | None:
        """The dataset `ref` names here: a bare name, or this storage's URL of one (a plan's
        pin); None for a folder path, which is a node-local dataset."""
        top = self.describe() + "/"
        if ref.startswith(top):
            return ref[len(top) :]
        return None if "/" in ref else ref

    def exists(self, name: str) -> bool:
        return self.storage.exists(DATASETS, name)

    def cleanup(self) -> list[tuple[str, str]]:
        """What prepares killed mid-upload left (files no manifest names, unfinished
        multipart uploads), swept as the checkpoint store sweeps its own: at start, before
        workers run. Returns (experiment, the storage's name for it), as that does."""
        return self.storage.cleanup(DATASETS, is_complete)

    def publish(self, folder: Path, name: str) -> None:
        """Upload the finished dataset in `folder` as `name`, its manifest last; FileExistsError
        when `name` is published already (a dataset is never replaced under its pins)."""
        with CheckpointWriter(self.storage.stage(DATASETS, name)) as writer:
            hashes = {}
            for path in sorted(folder.iterdir()):
                hashes[path.name] = _upload(path, writer)
            writer.commit(hashes, replace=False)

    def read(self, name: str) -> Listed:
        """Its manifest and dataset.json; DataError naming what is wrong (no manifest: not
        there, or its prepare has not finished)."""
        entry = Entry(self.storage, DATASETS, name)
        try:
            manifest = read_manifest(entry)
        except CheckpointCorrupt as exc:
            if not self.exists(name):
                raise DataError(
                    f"there is no dataset named {name!r} in {self.describe()} (POST "
                    "/runs/prepare makes one, or its prepare has not finished)"
                ) from None
            raise DataError(str(exc)) from None
        files = {f["name"]: (f["size"], f["sha256"]) for f in manifest["files"]}
        if DATASET_FILE not in files:
            raise DataError(f"{self.describe(name)}: its manifest lists no {DATASET_FILE}")
        try:
            with entry.open(DATASET_FILE) as f:
                raw = f.read(MAX_DATASET_JSON_BYTES + 1)
        except FileNotFoundError:
            raise DataError(f"{entry.describe(DATASET_FILE)}: missing; prepare it again") from None
        where = entry.describe(DATASET_FILE)
        dataset = parse_dataset(raw, Path(DATASETS, name), where, location=self.describe(name))
        return Listed(dataset, files)

    def tokenizer(self, name: str) -> bytes:
        """Its tokenizer.json, as the cache checked it against the manifest (bounded)."""
        entry = Entry(self.storage, DATASETS, name)
        try:
            with entry.open(TOKENIZER_FILE) as f:
                data = f.read(MAX_TOKENIZER_BYTES + 1)
        except FileNotFoundError:
            where = entry.describe(TOKENIZER_FILE)
            raise DataError(f"{where}: missing; prepare it again") from None
        if len(data) > MAX_TOKENIZER_BYTES:
            raise DataError(f"{entry.describe(TOKENIZER_FILE)}: too large for a tokenizer.json")
        return data

    def fetch(self, name: str) -> Dataset:
        """The dataset with every file downloaded into the local cache, checked against its
        manifest, and held open (`Dataset.held`): read it through `Dataset.path`."""
        listed = self.read(name)
        entry = Entry(self.storage, DATASETS, name)
        held: list[Any] = []
        paths = {}
        try:
            for file in listed.files:
                reader = entry.open(file)
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

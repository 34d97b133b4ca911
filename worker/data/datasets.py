"""A prepared dataset on the worker (docs/design/data.md, "Datasets"): the pinned folder read
again and checked against its pin, its shards, and what each checkpoint records of it.

Submit read the dataset's `dataset.json` and pinned what it said (`store.plans.DatasetPin`).
By the time a worker runs the plan, the folder may have been prepared again with other text
or another tokenizer; the run then fails, saying so, rather than train on tokens its plan
never named. The tokenizer file is read once, checked against its sha256 and kept in memory:
every checkpoint carries those bytes (`tokenizer.json` in its manifest), so a checkpoint can
be validated, sampled or exported without the dataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainctl.store.data.bucket import DatasetStore
from trainctl.store.data.datasets import (
    TOKENIZER_FILE,
    Dataset,
    TokenizerRef,
    read_dataset,
    read_tokenizer,
)
from trainctl.store.data.shards import DataError, read_shard
from trainctl.store.plans import DatasetPin, data_tokenizer
from trainctl.store.specs import DataSpec


def open_dataset(pin: DatasetPin, datasets: DatasetStore | None = None) -> Dataset:
    """The pinned dataset, provided its dataset.json still says what it said at submit: one
    of the worker's `datasets` (its files held open while it is read, a bucket's downloaded
    into the cache), else a folder read where it lies: a dataset a request named by its
    path (or any, where a plan is run outside a data dir: a test, a tool)."""
    if datasets is not None and (name := datasets.name_of(pin.folder)) is not None:
        dataset = datasets.fetch(name)
    elif "://" in pin.folder:
        raise DataError(
            f"dataset {pin.folder} is in a bucket this worker does not read; give the worker "
            "the service's TRAINCTL_STORAGE_URL"
        )
    else:
        dataset = read_dataset(Path(pin.folder))
    if DatasetPin.of(dataset) != pin:
        raise DataError(
            f"dataset {pin.folder} was prepared again since the run was submitted (its "
            "dataset.json no longer matches the plan's pin); submit the run again"
        )
    return dataset


def dataset_arrays(dataset: Dataset) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(train arrays, validation arrays): the splits' shards, memory-mapped."""
    splits = []
    for split in ("train", "val"):
        arrays = [read_shard(path) for path in dataset.shard_paths(split)]
        for path, array in zip(dataset.shard_paths(split), arrays, strict=True):
            if array.dtype != np.dtype(dataset.token_dtype):
                raise DataError(
                    f"{path}: {array.dtype} tokens, but dataset.json says {dataset.token_dtype}"
                )
        splits.append([a for a in arrays if len(a)])
    return splits[0], splits[1]


@dataclass(frozen=True)
class DataRecord:
    """What every checkpoint of a run records of its data."""

    metadata: dict[str, Any] = field(default_factory=dict)
    """metadata.json's `dataset` (its identity) and `tokenizer` (kind, sha256, eot id);
    None where unknown."""
    files: dict[str, bytes] = field(default_factory=dict)
    """Saved beside the weights and listed in the manifest: a bpe dataset's tokenizer.json."""


def build_data_record(
    data: DataSpec,
    dataset: DatasetPin | None,
    mixture: Sequence[DatasetPin] = (),
    datasets: DatasetStore | None = None,
) -> DataRecord:
    """A mixture's datasets share one tokenizer (checked at submit): its first's is saved,
    and the metadata lists each one's identity (`datasets`)."""
    pins = list(mixture) or ([dataset] if dataset is not None else [])
    if not pins:
        known = data_tokenizer(data, None) is not None  # byte-level text
        tokenizer = asdict(TokenizerRef("bytes")) if known else None
        return DataRecord({"dataset": None, "tokenizer": tokenizer})
    found = [open_dataset(pin, datasets) for pin in pins]
    try:
        tokenizer_file = read_tokenizer(found[0])
    finally:
        for f in found:
            f.close()
    metadata: dict[str, Any] = {
        "dataset": found[0].identity() if dataset is not None else None,
        "tokenizer": asdict(found[0].tokenizer),
    }
    if mixture:
        metadata["datasets"] = [f.identity() for f in found]
    return DataRecord(
        metadata, {TOKENIZER_FILE: tokenizer_file} if tokenizer_file is not None else {}
    )

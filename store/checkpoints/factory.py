"""The one place the folder stores are built from the settings (docs/design/checkpoints.md,
"Checkpoint store", "Storage"; docs/design/data.md, "Datasets"): the service and the worker, and
each rank of a multi-process run, open the same stores here from the same settings (the `layout` of
store.worker_settings `NodeSettings`), so which storage backs them is decided once: the
checkpoints, the exports and the prepared datasets all in the data dir, or all in the bucket.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainctl.store.checkpoints.posix import PosixStorage
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.bucket import DatasetStore
from trainctl.store.data.datasets import DATASET_FILE
from trainctl.store.layout import DataLayout

if TYPE_CHECKING:
    from trainctl.store.db.runs import RunStore


@dataclass(frozen=True)
class Stores:
    """The folder stores of one data dir."""

    layout: DataLayout
    """The data dir they were opened from: what another process needs to open them too."""
    checkpoints: CheckpointStore
    exports: CheckpointStore
    """Exports live in a store of their own, laid out as checkpoints are ("Exports")."""
    datasets: DatasetStore
    """The prepared datasets: the data dir's `datasets/` folder, or the bucket's."""


def open_stores(
    layout: DataLayout, runs: RunStore | None = None, *, interactive: bool = False
) -> Stores:
    """The checkpoint, export and dataset stores of a data dir: on its filesystem, or in the
    bucket of its `storage_url` (``s3://bucket/prefix``) when it has one, whose guard is
    then a lease in `runs`' database (without `runs`, a lock of this process only).
    `interactive` (the service): each request to the bucket gives up within seconds
    (`SERVICE_TIMEOUTS`), so that a frozen bucket is a prompt 503, not a held request."""
    if layout.storage_url is None:
        return Stores(
            layout,
            CheckpointStore(PosixStorage(layout.checkpoints)),
            CheckpointStore(PosixStorage(layout.exports)),
            _local_datasets(layout),
        )
    from trainctl.store.checkpoints.s3 import (
        SERVICE_TIMEOUTS,
        WORKER_TIMEOUTS,
        S3Storage,
        build_client,
        parse_url,
    )
    from trainctl.store.db.guards import GuardLeases

    bucket, prefix = parse_url(layout.storage_url)
    # one connection pool for all the stores
    client = build_client(SERVICE_TIMEOUTS if interactive else WORKER_TIMEOUTS)
    leases = GuardLeases(runs.engine) if runs is not None else None

    def in_bucket(where: str, leases: GuardLeases | None) -> S3Storage:
        return S3Storage(
            bucket, where, cache_dir=layout.cache, client=client, leases=leases,
            max_cache_bytes=layout.cache_bytes,
        )  # fmt: skip

    checkpoints, exports = (
        CheckpointStore(in_bucket(f"{prefix}/{name}".lstrip("/"), leases))
        for name in ("checkpoints", "exports")
    )
    # Datasets are published once and never replaced: no guard to take, so no lease.
    datasets = DatasetStore(in_bucket(prefix, None))
    return Stores(layout, checkpoints, exports, datasets)


def _local_datasets(layout: DataLayout) -> DatasetStore:
    """The data dir's `datasets/` folder as a storage, opened at its real path: an
    administrator may link it to a larger disk, and a run's pin names it by that path (a
    storage follows no link below its root). Its entries are committed by their dataset.json
    (`PosixStorage`'s marker), and read with their hardlinks."""
    folder = Path(os.path.realpath(layout.datasets))
    return DatasetStore(PosixStorage(folder.parent, DATASET_FILE, hardlinks=True), folder.name)

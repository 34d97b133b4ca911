"""The one place the folder stores are built from the settings (docs/design/checkpoints.md,
"Checkpoint store", "Storage"): the service (`Settings.layout`) and the worker
(`WorkerConfig.data_dir`, and each rank of a multi-process run) open the same stores here,
so which storage backs them is decided once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainctl.store.checkpoints.posix import PosixStorage
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.bucket import BucketDatasets
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
    datasets: BucketDatasets | None = None
    """The prepared datasets in the bucket, when there is one; None: in the data dir's
    `datasets/` folder, as ever (`DataLayout.datasets`)."""


def open_stores(layout: DataLayout, runs: RunStore | None = None) -> Stores:
    """The checkpoint and export stores of a data dir: on its filesystem, or in the bucket
    of its `storage_url` (``s3://bucket/prefix``) when it has one, whose guard is then a
    lease in `runs`' database (without `runs`, a lock of this process only), and the
    bucket's prepared datasets beside them."""
    if layout.storage_url is None:
        return Stores(
            layout,
            CheckpointStore(PosixStorage(layout.checkpoints)),
            CheckpointStore(PosixStorage(layout.exports)),
        )
    from trainctl.store.checkpoints.s3 import S3Storage, build_client, parse_url
    from trainctl.store.db.guards import GuardLeases

    bucket, prefix = parse_url(layout.storage_url)
    client = build_client()  # one connection pool for both stores
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
    datasets = BucketDatasets(in_bucket(prefix, None))
    return Stores(layout, checkpoints, exports, datasets)

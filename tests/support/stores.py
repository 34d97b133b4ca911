"""Checkpoint stores for tests: on a folder (POSIX), in memory or in a bucket, and ways to
reach under the store's policy (the folders of a POSIX store, entries written as a storage
holds them); a data dir's dataset store."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tests.support.s3server import S3Server
from trainctl.store.checkpoints.factory import open_stores
from trainctl.store.checkpoints.manifests import MANIFEST_FILE, build_manifest, manifest_bytes
from trainctl.store.checkpoints.posix import PosixStorage
from trainctl.store.checkpoints.s3 import S3Storage
from trainctl.store.checkpoints.storage import Entry
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.bucket import DatasetStore
from trainctl.store.layout import DataLayout


def posix_store(root: Path) -> CheckpointStore:
    return CheckpointStore(PosixStorage(root))


def dataset_store(data_dir: Path) -> DatasetStore:
    """The prepared datasets of a data dir (its `datasets/` folder), as `open_stores` opens
    them for the service and the workers."""
    return open_stores(DataLayout(data_dir)).datasets


def s3_store(
    server: S3Server, bucket: str, cache: Path, prefix: str = "ckpt", **options: Any
) -> CheckpointStore:
    """A store in `bucket` of a test's S3 server; a save killed in another process is swept
    at once (`stale_after` 0), not an hour later."""
    options.setdefault("stale_after", 0.0)
    storage = S3Storage(bucket, prefix, cache_dir=cache, client=server.client(), **options)
    return CheckpointStore(storage)


def folder(store: CheckpointStore, experiment: str, tag: str | None = None) -> Path:
    """Where a POSIX store keeps an experiment or a checkpoint, for tests of the folders."""
    storage = store.storage
    assert isinstance(storage, PosixStorage), "a test of folders needs a POSIX store"
    return storage.path_of(experiment, tag)


def manifest_of(files: dict[str, bytes]) -> bytes:
    """The manifest a writer would write for these files."""
    entries = [
        {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for name, data in files.items()
    ]
    return manifest_bytes(build_manifest(entries))


def read_files(store: CheckpointStore, experiment: str, tag: str) -> dict[str, bytes]:
    """Every file the manifest lists, and the manifest, as the storage holds them."""
    entry = store.entry(experiment, tag)
    with entry.open(MANIFEST_FILE) as f:
        raw = f.read()
    files = {}
    for listed in json.loads(raw)["files"]:
        with entry.open(listed["name"]) as f:
            files[listed["name"]] = f.read()
    return {**files, MANIFEST_FILE: raw}


def write_entry(store: CheckpointStore, experiment: str, tag: str, files: dict[str, bytes]) -> None:
    """Commit exactly `files` as entry `tag`, past the store's rules (no manifest is made):
    how a damaged or foreign checkpoint comes to be in any storage."""
    staged = store.storage.stage(experiment, tag)
    for name, data in files.items():
        sink = staged.create(name)
        sink.write(data)
        sink.close()
    staged.commit()


def rewrite(
    store: CheckpointStore, experiment: str, tag: str, changes: dict[str, bytes | None]
) -> None:
    """Replace files of a committed checkpoint (None removes one), keeping its manifest."""
    files = {**read_files(store, experiment, tag), **changes}
    write_entry(store, experiment, tag, {n: d for n, d in files.items() if d is not None})


def entry_at(path: Path) -> Entry:
    """The files of the checkpoint folder `path` (<checkpoints>/<experiment>/<tag>), read as
    the POSIX store reads them."""
    return posix_store(path.parent.parent).entry(path.parent.name, path.name)


def race_commits(
    server: tuple[str, str, str],
    bucket: str,
    cache: Path,
    who: str,
    rounds: int,
    barrier: Any,
    results: Any,
) -> None:
    """One of two processes committing the same new tags at once (`replace` False): each
    round stages step_<n> with weights of its own, meets the other at `barrier`, commits, and
    puts (who, n, "won" or "exists") on `results`. Run in a process of its own (spawn)."""
    from trainctl.store.checkpoints.manifests import METADATA_FILE, MODEL_FILE
    from trainctl.store.names import step_tag

    # An hour, as in service: the other process's stage of this very round is in flight.
    store = s3_store(S3Server(*server), bucket, cache, stale_after=3600.0)
    for n in range(rounds):
        with store.stage("race", step_tag(n)) as staged:
            staged.write(MODEL_FILE, f"{who} {n}".encode())
            staged.write(METADATA_FILE, json.dumps({"step": n, "run_id": who}).encode())
            barrier.wait()
            try:
                staged.commit(replace=False)
            except FileExistsError:
                results.put((who, n, "exists"))
            else:
                results.put((who, n, "won"))

"""torch.distributed.checkpoint's storage layer on the checkpoint store (docs/design/checkpoints.md,
"Sharded checkpoints").

DCP plans a save (which rank writes which chunk of which tensor) and a load (which chunks a
rank needs, whatever world size saved them); where the bytes go is a `StorageWriter`'s and a
`StorageReader`'s. DCP's own `FileSystemWriter` writes to paths of its choosing, its tensors
as torch pickles; these write into a staged entry of the store instead (each rank its own
files, through the sinks of the stage it joined), hash every byte as it goes, and keep each
rank's tensors in one safetensors file whose header says which chunk of which tensor each one
is: the store stitches the model file from those without torch
(`store.checkpoints.consolidate`). Non-tensor state (optimizer hyper-parameters) goes to a
small file per rank; DCP's plan of the whole checkpoint to `dcp.metadata`, loaded with
`weights_only=True` like every pickle of a checkpoint.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import IO, Any, cast

import torch
from safetensors import safe_open
from safetensors.torch import load as load_safetensors
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from trainctl.store.checkpoints.consolidate import (
    CHUNKS_KEY,
    DCP_METADATA_FILE,
    SHARD_BYTES_FILE,
    SHARD_FILE,
)
from trainctl.store.checkpoints.storage import Files
from trainctl.store.checkpoints.writer import CheckpointWriter
from trainctl.worker.checkpoints.hashed_file import HashedFile
from trainctl.worker.checkpoints.safetensors_stream import write_safetensors
from trainctl.worker.exceptions import CheckpointCorrupt


@dataclass(frozen=True)
class Stored:
    """Where DCP finds one item: a file of the checkpoint and, in it, a safetensors key (a
    tensor chunk) or a byte range (non-tensor state)."""

    name: str
    key: str | None = None
    offset: int = 0
    length: int = 0


# What dcp.metadata may hold: DCP's plan types, torch.Size and these. Nothing else unpickles.
SAFE_GLOBALS: list[Any] = [
    dcp_metadata.Metadata,
    dcp_metadata.MetadataIndex,
    dcp_metadata.StorageMeta,
    dcp_metadata.TensorStorageMetadata,
    dcp_metadata.BytesStorageMetadata,
    dcp_metadata.ChunkStorageMetadata,
    dcp_metadata.TensorProperties,
    dcp_metadata._MEM_FORMAT_ENCODING,
    torch.Size,
    Stored,
]


class StoreWriter(StorageWriter):
    """Writes this rank's part of a DCP save into `writer` (the stage it owns or joined).

    `hashes` collects the sha256 of every file written here, for the manifest. `stage`
    (async saves) copies the state to CPU memory it keeps from save to save.
    """

    def __init__(self, writer: CheckpointWriter, rank: int) -> None:
        super().__init__()
        self.writer, self.rank = writer, rank
        self.hashes: dict[str, str] = {}
        self._buffers: dict[str, Any] | None = None

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """CPU copies of the state, into buffers allocated at the first save and reused
        (pinned only where there is a GPU to copy from: DCP's own cache always pins, which a
        CPU-only torch cannot)."""
        if self._buffers is None:
            self._buffers = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
        return cast(dict[str, Any], _copy_state_dict(state_dict, self._buffers))

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        pass

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # Which rank a plan is: the files it writes are named by it.
        return [replace(plan, storage_data=rank) for rank, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        rank = plan.storage_data
        results: list[WriteResult] = []
        tensors: dict[str, torch.Tensor] = {}
        chunks: dict[str, dict[str, Any]] = {}
        raw = io.BytesIO()
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                blob = cast(io.BytesIO, data).getvalue()
                stored = Stored(SHARD_BYTES_FILE.format(rank=rank), None, raw.tell(), len(blob))
                raw.write(blob)
                results.append(WriteResult(item.index, len(blob), stored))
                continue
            t = cast(torch.Tensor, data).detach()
            fqn = item.index.fqn
            if fqn in chunks:
                raise ValueError(f"rank {rank} holds two chunks of {fqn!r}: a mesh we do not plan")
            assert item.tensor_data is not None
            tensors[fqn] = t.cpu().contiguous()
            chunks[fqn] = {
                "fqn": fqn,
                "offsets": list(item.tensor_data.chunk.offsets),
                "shape": list(item.tensor_data.size),
            }
            size = t.numel() * t.element_size()
            results.append(WriteResult(item.index, size, Stored(SHARD_FILE.format(rank=rank), fqn)))
        meta = {CHUNKS_KEY: json.dumps(chunks)}
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainctl-shard") as pool:
            self._write(
                SHARD_FILE.format(rank=rank), pool, lambda f: write_safetensors(tensors, f, meta)
            )
        if raw.tell():
            self.writer.write(SHARD_BYTES_FILE.format(rank=rank), raw.getvalue())
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def _write(self, name: str, pool: ThreadPoolExecutor, write: Any) -> None:
        with HashedFile(self.writer.create(name), pool) as f:
            write(f)
        self.hashes[name] = f.hexdigest()

    def finish(self, metadata: dcp_metadata.Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
        buffer = io.BytesIO()
        torch.save(metadata, buffer)
        self.writer.write(DCP_METADATA_FILE, buffer.getvalue())

    def storage_meta(self) -> dcp_metadata.StorageMeta | None:
        return None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False  # never chosen by a checkpoint_id: it is given the stage


class StoreReader(StorageReader):
    """Reads the chunks this rank needs from a committed sharded checkpoint's files, as the
    store opens them (no link followed)."""

    def __init__(self, files: Files) -> None:
        super().__init__()
        self.files = files
        self.storage_data: dict[Any, Stored] = {}

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self.storage_data = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        try:
            with (
                self.files.open(DCP_METADATA_FILE) as f,
                torch.serialization.safe_globals(SAFE_GLOBALS),
            ):
                metadata = torch.load(cast(IO[bytes], f), weights_only=True)
        except (pickle.UnpicklingError, FileNotFoundError) as exc:
            raise CheckpointCorrupt(
                f"{self.files.describe(DCP_METADATA_FILE)}: not a plan of ours ({exc})"
            ) from exc
        return cast(dcp_metadata.Metadata, metadata)

    def set_up_storage_reader(
        self, metadata: dcp_metadata.Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        by_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            by_file.setdefault(self.storage_data[item.storage_index].name, []).append(item)
        for name, items in by_file.items():
            with self._opened(name) as data:
                for item in items:
                    self._read_item(item, data, planner)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    @contextmanager
    def _opened(self, name: str) -> Iterator[Any]:
        """A shard file's tensors (mapped when the file is local), or a bytes file's bytes."""
        with self.files.open(name) as f:
            if not name.endswith(".safetensors"):
                yield f.read()
            elif f.local_path is not None:
                with safe_open(f.local_path, framework="pt") as st:
                    yield st
            else:
                yield _Loaded(load_safetensors(f.read()))

    def _read_item(self, item: ReadItem, data: Any, planner: LoadPlanner) -> None:
        stored = self.storage_data[item.storage_index]
        if item.type == LoadItemType.BYTE_IO:
            planner.load_bytes(
                item, io.BytesIO(data[stored.offset : stored.offset + stored.length])
            )
            return
        tensor = narrow_tensor_by_index(
            data.get_tensor(stored.key), item.storage_offsets, item.lengths
        )
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise CheckpointCorrupt(
                f"{self.files.describe(stored.name)}: {stored.key!r} has shape "
                f"{tuple(tensor.size())}, the plan expects {tuple(target.size())}"
            )
        target.copy_(tensor)
        planner.commit_tensor(item, target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False


@dataclass(frozen=True)
class _Loaded:
    """A safetensors file read whole, answering as `safe_open` does."""

    tensors: dict[str, torch.Tensor]

    def get_tensor(self, key: str) -> torch.Tensor:
        return self.tensors[key]


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's planner, but non-tensor state unpickles with `weights_only=True`: a checkpoint
    is data, never code."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj

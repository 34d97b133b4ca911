"""Sharded checkpoints: every rank writes its own shards, on the store's commit protocol
(docs/design/checkpoints.md, "Sharded checkpoints").

An FSDP2 model's parameters and optimizer state are DTensors, each rank holding a slice.
Gathering them to rank 0 to write one file costs the memory and the time sharding was meant
to save, so each rank writes its slices itself, in parallel, with torch.distributed.checkpoint
(DCP), through `dcp_storage` into the one staged entry of the checkpoint: rank 0 makes the
stage and tells the others its key, they join it (`CheckpointStore.join`). Once DCP's save
returns everywhere, the ranks hand rank 0 the names, sizes and sha256s of what they wrote (a
gather: the barrier), and rank 0 writes metadata.json (the RNG of every rank in it) and the
manifest, and commits by the store's rename (or manifest PUT) as a whole checkpoint does. A
rank that dies before that gather leaves a stage no listing shows, which cleanup removes.

Loads go through `torch.distributed.checkpoint.state_dict`: `get_state_dict` describes what
this process holds (a slice at any world size, or the whole tensors of a single-process or
DDP model), DCP reads exactly those chunks, and `set_state_dict` puts them in place, so a
checkpoint saved at one world size loads at any other, state-exact.

Async saves (`worker.checkpoints.async_sharded`) do what `dcp.async_save` does (stage a CPU
copy, save it on a thread) on a gloo group of their own (as torchtitan does), so the save's
and the commit's collectives never interleave with training's; the loop stalls only while
the state is copied to CPU buffers kept from save to save, or not at all with background
staging.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from trainctl.store.checkpoints.manifests import (
    DCP_LAYOUT,
    METADATA_FILE,
    read_metadata,
    verify_manifest,
)
from trainctl.store.checkpoints.storage import Files
from trainctl.store.checkpoints.store import CheckpointStore, Protection
from trainctl.store.checkpoints.writer import CheckpointWriter
from trainctl.worker.checkpoints.dcp_storage import SafeLoadPlanner, StoreReader, StoreWriter
from trainctl.worker.checkpoints.state import check_model_fits, retain_after, write_failure
from trainctl.worker.checkpoints.training_state import (
    TrainingState,
    capture_rng_state,
    checkpoint_metadata,
)
from trainctl.worker.exceptions import CheckpointMismatch, CheckpointWriteFailed
from trainctl.worker.models import state_module
from trainctl.worker.training.optim import Optimizers
from trainctl.worker.training.parallel import rank_and_world
from trainctl.worker.training.schedule import WSDScheduler

MODEL_KEY = "model"
OPTIMIZERS_KEY = "optimizers"
"""The state's top-level keys: tensors are named `model.<name>`, `optimizers.<optimizer
name>.state.<param>.<buffer>` in the shard files (`consolidate.MODEL_PREFIX`)."""


@dataclass
class ShardedState:
    """One rank's part of a checkpoint captured at a step: the live (sharded) tensors and,
    for rank 0 to write, the metadata and further files."""

    experiment: str
    tag: str
    state: dict[str, Any]
    metadata: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)


@contextmanager
def one_process_quiet(world: int) -> Iterator[None]:
    """DCP warns on every save and load without a process group "assuming the intent is to
    load in a single process": in one process that is the intent."""
    with warnings.catch_warnings():
        if world == 1:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def first_rank(group: dist.ProcessGroup | None) -> int:
    """The global rank of `group`'s rank 0: what collectives name as source or destination."""
    return dist.get_global_rank(group, 0) if group is not None else 0


def dcp_state(model: nn.Module, optimizers: Optimizers | None) -> dict[str, Any]:
    """What DCP saves and loads: the model's and each optimizer's state, as this process
    holds them (DTensor slices under FSDP2, whole tensors otherwise), by stable names (a
    transformers model's own: `state_module`)."""
    root = state_module(model)
    state: dict[str, Any] = {MODEL_KEY: get_model_state_dict(root)}
    if optimizers is not None:
        state[OPTIMIZERS_KEY] = {
            name: get_optimizer_state_dict(root, optimizer)
            for name, optimizer in optimizers.items()
        }
    return state


def capture_sharded(
    state: TrainingState, tag: str | None = None, *, group: dist.ProcessGroup | None = None
) -> ShardedState:
    """This rank's part of `state` at this step (a collective: every rank calls it); `tag`
    defaults to the step's. No tensor is copied: save it before the next step."""
    tag = state.tag(tag)
    world = rank_and_world(group)[1]
    rngs: list[Any] = [capture_rng_state()]
    if world > 1:
        rngs = [None] * world
        dist.all_gather_object(rngs, capture_rng_state(), group=group)
    metadata = checkpoint_metadata(state, tag, extra={"world_size": world, "rng_per_rank": rngs})
    shards = dcp_state(state.model, state.optimizers)
    return ShardedState(state.experiment, tag, shards, metadata, dict(state.files))


# --- saving ---------------------------------------------------------------------------------


def open_stage(store: CheckpointStore, experiment: str, tag: str, group: Any) -> CheckpointWriter:
    """Rank 0 stages the checkpoint; the other ranks join its stage (a collective)."""
    rank, world = rank_and_world(group)
    writer, failure = None, None
    if rank == 0:
        try:
            writer = store.stage(experiment, tag)
        except BaseException as exc:  # raised below, once the others know not to join
            failure = exc
    if world > 1:
        keys = [writer.key if writer is not None else None]
        dist.broadcast_object_list(keys, src=first_rank(group), group=group)
    if failure is not None:
        raise failure
    if writer is not None:
        return writer
    if keys[0] is None:
        raise CheckpointWriteFailed(f"rank 0 could not stage {store.describe(experiment, tag)}")
    return store.join(experiment, tag, keys[0])


def finish_save(
    state: ShardedState,
    store: CheckpointStore,
    writer: CheckpointWriter,
    storage: StoreWriter,
    group: Any,
    *,
    max_keep: int | None,
    protected: Protection,
    before_commit: Callable[[], None] | None,
    after_write: Callable[[], None] | None,
    after_commit: Callable[[], None] | None = None,
) -> str:
    """After DCP wrote every rank's files: gather their listings on rank 0 (the barrier),
    which writes the metadata and the manifest and commits; every rank learns the outcome.
    `after_commit` runs on rank 0 once committed, before the retention."""
    rank, world = rank_and_world(group)
    listing = writer.listing(storage.hashes) if rank != 0 else []
    if after_write is not None:
        after_write()
    listings: list[Any] = [listing]
    if world > 1:
        listings = [None] * world if rank == 0 else []
        dist.gather_object(
            listing, listings if rank == 0 else None, dst=first_rank(group), group=group
        )
    outcome: list[Any] = [None]
    error: BaseException | None = None
    if rank == 0:
        try:
            for other in listings[1:]:
                writer.adopt(other)
            writer.write(METADATA_FILE, json.dumps(state.metadata, indent=2).encode())
            for name, data in state.files.items():
                writer.write(name, data)
            writer.commit(storage.hashes, before_commit=before_commit, layout=DCP_LAYOUT)
        except BaseException as exc:
            writer.abort()
            error, outcome = exc, [f"{type(exc).__name__}: {exc}"]
    if world > 1:
        dist.broadcast_object_list(outcome, src=first_rank(group), group=group)
    if error is not None:
        raise error
    if outcome[0] is not None:
        raise CheckpointWriteFailed(
            f"rank 0 could not commit {store.describe(state.experiment, state.tag)}: {outcome[0]}"
        )
    if rank == 0 and after_commit is not None:
        after_commit()
    if rank == 0 and max_keep is not None:
        retain_after(store, state.experiment, state.tag, max_keep, protected)
    return store.describe(state.experiment, state.tag)


def write_sharded(
    state: ShardedState,
    store: CheckpointStore,
    *,
    group: dist.ProcessGroup | None = None,
    max_keep: int | None = 3,
    protected: Protection = frozenset(),
    before_commit: Callable[[], None] | None = None,
    after_write: Callable[[], None] | None = None,
    after_commit: Callable[[], None] | None = None,
) -> str:
    """Write and commit a captured state, every rank its own shards (a collective); return
    where it is, in words. `before_commit` runs on rank 0 before the commit (the lease
    check), `after_commit` after it, before the retention; `after_write` on every rank once
    its files are durable, before the ranks agree."""
    rank, world = rank_and_world(group)
    writer = open_stage(store, state.experiment, state.tag, group)
    try:
        storage = StoreWriter(writer, rank)
        with one_process_quiet(world):
            dcp.save(
                state.state,
                storage_writer=storage,
                planner=None,
                process_group=group,
                no_dist=world == 1,
            )
        return finish_save(
            state,
            store,
            writer,
            storage,
            group,
            max_keep=max_keep,
            protected=protected,
            before_commit=before_commit,
            after_write=after_write,
            after_commit=after_commit,
        )
    except OSError as exc:
        writer.abort()
        raise CheckpointWriteFailed(write_failure(exc, store, state.experiment, state.tag)) from exc
    except BaseException:
        writer.abort()
        raise


# --- loading --------------------------------------------------------------------------------


def load_sharded(
    model: nn.Module,
    optimizers: Optimizers | None,
    scheduler: WSDScheduler | None,
    checkpoint: Files,
    *,
    group: dist.ProcessGroup | None = None,
) -> dict[str, Any]:
    """Restore a sharded checkpoint into `model` (FSDP2 at any world size, DDP, or one
    process) and `optimizers` (a collective when distributed); return its metadata.

    Every file is checked against the manifest first (rank 0 re-hashes them all, the others
    check sizes: the ranks read the same files), so a damaged shard fails here. The RNG state
    of each rank is `worker.checkpoints.training_state.rank_rng(metadata, rank)`.
    """
    rank, world = rank_and_world(group)
    where = checkpoint.describe()
    verify_manifest(checkpoint, deep=rank == 0)
    if world > 1:
        dist.barrier(group=group)  # rank 0's re-hash done (it raises there, and others wait)
    metadata = read_metadata(checkpoint)
    check_model_fits(model, metadata, where)
    saved_kind = metadata.get("optimizer_kind")
    if optimizers is not None and saved_kind not in (None, optimizers.kind):
        raise CheckpointMismatch(
            f"checkpoint {where}: its optimizer state is of kind {saved_kind!r}, this run "
            f"trains with {optimizers.kind!r}; resume with the kind it was saved with"
        )
    state = dcp_state(model, optimizers)
    with one_process_quiet(world):
        dcp.load(
            state,
            storage_reader=StoreReader(checkpoint),
            planner=SafeLoadPlanner(),
            process_group=group,
            no_dist=world == 1,
        )
    root = state_module(model)
    set_model_state_dict(root, state[MODEL_KEY])
    for name, optimizer in (optimizers or {}).items():
        set_optimizer_state_dict(root, optimizer, state[OPTIMIZERS_KEY][name])
    if scheduler is not None and metadata.get("scheduler"):
        scheduler.load_state_dict(metadata["scheduler"])
    return metadata

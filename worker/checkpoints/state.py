"""Saving and loading training state in the checkpoint store (see store.checkpoints.store).

A save writes every file into a staged entry of the store, the manifest last, and commits
it: a checkpoint is visible complete or not at all. Loads read through the store too, never
by a path of their own. Weights are saved in the master dtype so a resumed run continues the
interrupted one exactly; bf16 is an export option. Optimizer state is loaded with
weights_only=True: a checkpoint is data, never code.

Capturing a checkpoint copies nothing: it holds the live tensors, on their device. The one
copy to the host is made by whoever writes: `write_checkpoint` (a synchronous save: weights
to the CPU, the optimizer state through torch.save) or `AsyncCheckpointer.snapshot` (into
its reusable pinned buffers). A capture taken and then copied again would stall the loop for
two copies of the weights.
"""

from __future__ import annotations

import errno
import json
import logging
import pickle
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any, Protocol, cast

import torch
from safetensors.torch import load, load_file
from torch import nn

from trainctl.store.checkpoints.info import check_fits
from trainctl.store.checkpoints.manifests import (
    DCP_LAYOUT,
    METADATA_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    manifest_layout,
    read_metadata,
    verify_manifest,
)
from trainctl.store.checkpoints.storage import Files
from trainctl.store.checkpoints.store import CheckpointStore, Protection
from trainctl.store.checkpoints.writer import CheckpointWriter
from trainctl.store.db.outages import UNAVAILABLE
from trainctl.store.models.hf_config import HfModelConfig, model_config_from_dict
from trainctl.store.models.plugin import PluginModelConfig
from trainctl.store.models.presets import ModelConfig
from trainctl.worker.checkpoints.hashed_file import HashedFile
from trainctl.worker.checkpoints.safetensors_stream import write_safetensors
from trainctl.worker.checkpoints.training_state import TrainingState, checkpoint_metadata
from trainctl.worker.exceptions import (
    CheckpointCorrupt,
    CheckpointMismatch,
    CheckpointWriteFailed,
    LeaseExpired,
)
from trainctl.worker.training.optim import Optimizers
from trainctl.worker.training.schedule import WSDScheduler

log = logging.getLogger("trainctl.worker")


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors by name: the live ones, detached, not copies (see CheckpointState)."""
    return {name: t.detach() for name, t in model.state_dict().items()}


class StateAccess(Protocol):
    """How a checkpoint reads and restores the full training state of a process: its own
    tensors (`LocalState`), or a sharded run's, gathered and scattered across its ranks
    (worker.training.fsdp). Either way the checkpoint holds the same files: `model.safetensors` of
    the whole model and `optimizer.pt` of whole optimizer states."""

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]: ...
    def optimizer_state(self, model: nn.Module, optimizers: Optimizers) -> dict[str, Any]: ...
    def load_model_state(
        self, model: nn.Module, state: dict[str, torch.Tensor], strict: bool
    ) -> None: ...
    def load_optimizer_state(
        self, model: nn.Module, optimizers: Optimizers, state: dict[str, Any]
    ) -> None: ...


class LocalState:
    """`StateAccess` of a process that holds the whole model and optimizer state (one
    process, or a DDP replica)."""

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return model_state(model)

    def optimizer_state(self, model: nn.Module, optimizers: Optimizers) -> dict[str, Any]:
        return optimizers.state_dict()  # by optimizer name: {"muon": ..., "adamw": ...}

    def load_model_state(
        self, model: nn.Module, state: dict[str, torch.Tensor], strict: bool
    ) -> None:
        model.load_state_dict(state, strict=strict)

    def load_optimizer_state(
        self, model: nn.Module, optimizers: Optimizers, state: dict[str, Any]
    ) -> None:
        optimizers.load_state_dict(state)


LOCAL_STATE = LocalState()


@dataclass
class CheckpointState:
    """Everything one checkpoint holds, captured at one step: what `write_checkpoint` writes.

    `model` and `optimizer` hold the live tensors, on their device and in the master dtype:
    capturing copies nothing, so they must not change until the state is written (a
    synchronous save) or staged (`AsyncCheckpointer.snapshot`, which puts CPU copies in the
    saved dtype in their place). `host_weights` is what lands in the weights file.
    """

    experiment: str
    tag: str
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    metadata: dict[str, Any]
    dtype: torch.dtype | None = None
    """The dtype floating-point weights are saved in; None keeps each tensor's own."""
    files: dict[str, bytes] = field(default_factory=dict)
    """Further files, by name, written as they are and listed in the manifest like the
    others: a bpe run's tokenizer.json. Bytes, not paths: what was checked is what is saved."""

    def saved_dtype(self, t: torch.Tensor) -> torch.dtype:
        return self.dtype if self.dtype is not None and t.is_floating_point() else t.dtype

    def host_weights(self) -> dict[str, torch.Tensor]:
        """The weights as CPU tensors in the saved dtype: one copy from a device; none at all
        for CPU tensors already in that dtype (staged ones, or a CPU run's master weights).

        On a device a cast is made there, before the copy: only the saved bytes cross to the
        host, and they are the device's conversion whichever path saves them.
        """
        return {k: t.to(self.saved_dtype(t)).cpu().contiguous() for k, t in self.model.items()}


def capture_checkpoint(
    state: TrainingState,
    tag: str | None = None,
    *,
    dtype: torch.dtype | None = None,
    access: StateAccess = LOCAL_STATE,
) -> CheckpointState:
    """`state` at this step, as a full checkpoint holds it, the RNG state included (capture
    it at the step); `tag` defaults to the step's. `dtype`: the weights' saved dtype (None:
    each tensor's own); `access`: how the whole state is read (a sharded run's gathers it).

    No tensor is copied (see CheckpointState): write it or hand it to an AsyncCheckpointer
    before the model or the optimizers take another step.
    """
    tag = state.tag(tag)
    metadata = checkpoint_metadata(state, tag, dtype=dtype)
    # A sharded run's ranks gather both collectively, onto rank 0 (the one that writes);
    # the optimizers' state is by name: {"muon": ..., "adamw": ...}.
    weights = access.model_state(state.model)
    optimizer = access.optimizer_state(state.model, state.optimizers)
    files = dict(state.files)
    return CheckpointState(state.experiment, tag, weights, optimizer, metadata, dtype, files)


def write_checkpoint(
    state: CheckpointState,
    store: CheckpointStore,
    max_keep: int | None = 3,
    protected: Protection = frozenset(),
    before_commit: Callable[[], None] | None = None,
    after_commit: Callable[[], None] | None = None,
) -> str:
    """Write a captured state into `store` and commit it (see capture_checkpoint); return
    where it is, in words. `after_commit` runs once the checkpoint is committed, before the
    retention that may delete older ones (a train run queues its evaluations there).

    Weights and optimizer state go through `HashedFile`s, which hash each tensor's bytes
    while writing them into the staged entry, whose sinks start their write-out at once: the
    sha256 of the manifest costs no second read, and the flush before the commit finds little
    left to do. The two files are written at the same time (one thread each, plus one
    hashing thread each): a sha256 runs at about 2 GB/s per core, so one file at a time
    leaves cores idle.

    Device tensors are copied to the host here, once, on the calling thread (the training
    thread for a synchronous save, so in order with the steps it has queued): the weights
    by `host_weights`, the optimizer state by torch.save itself.
    """
    experiment, tag = state.experiment, state.tag
    weights = state.host_weights()
    try:
        # A failed save removes its stage at once: it is invisible anyway, but on a full
        # disk its bytes are what the next save (or another run) needs.
        with store.stage(experiment, tag) as staged:
            hashes = write_files(state, weights, staged)
            staged.commit(hashes, before_commit=before_commit)
    except OSError as exc:
        raise CheckpointWriteFailed(write_failure(exc, store, experiment, tag)) from exc
    if after_commit is not None:
        after_commit()
    if max_keep is not None:
        retain_after(store, experiment, tag, max_keep, protected)
    return store.describe(experiment, tag)


def write_files(
    state: CheckpointState, weights: dict[str, torch.Tensor], staged: CheckpointWriter
) -> dict[str, str]:
    """Every file of the checkpoint but the manifest; the sha256 of those hashed on the way.
    Created in the manifest's order: weights, optimizer state, metadata, the others."""
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="trainctl-save") as pool:
        model_file = HashedFile(staged.create(MODEL_FILE), pool)
        optimizer_file = HashedFile(staged.create(OPTIMIZER_FILE), pool)

        def write_hashed(f: HashedFile, write: Callable[[HashedFile], None]) -> str:
            with f:
                write(f)
            return f.hexdigest()

        model = pool.submit(write_hashed, model_file, lambda f: write_safetensors(weights, f))
        hashes = {
            # torch.save needs only write (and flush); HashedFile is no full IO.
            OPTIMIZER_FILE: write_hashed(
                optimizer_file, lambda f: torch.save(state.optimizer, cast(IO[bytes], f))
            )
        }
        hashes[MODEL_FILE] = model.result()
    staged.write(METADATA_FILE, json.dumps(state.metadata, indent=2).encode())
    for name, data in state.files.items():
        assert name not in (MODEL_FILE, OPTIMIZER_FILE, METADATA_FILE), name
        staged.write(name, data)
    return hashes


def write_failure(exc: BaseException, store: CheckpointStore, experiment: str, tag: str) -> str:
    """Say which store failed and how, in words a user can act on."""
    full = getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or (
        "No space left" in str(exc) or "quota" in str(exc).lower()
    )
    if full:
        problem, advice = "full", "free space there (prune old checkpoints) or use a larger disk"
    else:
        problem, advice = "not writable", "check that it exists and this worker may write to it"
    return (
        f"checkpoint store {problem}: could not save checkpoint {experiment}/{tag} in "
        f"{store.describe(experiment)}: {exc}; {advice}. Earlier checkpoints are intact."
    )


def load_checkpoint(
    model: nn.Module,
    optimizers: Optimizers | None,
    scheduler: WSDScheduler | None,
    checkpoint: Files,
    device: torch.device | str = "cpu",
    strict: bool = True,
    access: StateAccess = LOCAL_STATE,
) -> dict[str, Any]:
    """Restore model, optimizers and scheduler from a checkpoint (`CheckpointStore.entry`);
    return its metadata. `access`: how the state lands in the model and optimizers (a
    sharded run's ranks each keep their shard of it).

    The manifest is verified first (sizes and sha256), so a truncated or altered file is an
    error here rather than a silently wrong model, and optimizer state of other optimizers
    than `optimizers` (another optimizer kind's) is a CheckpointMismatch naming both. RNG
    state and the data position are in the returned metadata (`restore_rng_state(meta["rng"])`,
    `meta["data_position"]`).
    """
    where = checkpoint.describe()
    if manifest_layout(verify_manifest(checkpoint, deep=False)) == DCP_LAYOUT:
        # Sharded: DCP reads it into this model (one process here), checks and all.
        from trainctl.worker.checkpoints.sharded import load_sharded

        return load_sharded(model, optimizers, scheduler, checkpoint)
    verify_manifest(checkpoint, deep=True)
    metadata = read_metadata(checkpoint)
    check_model_fits(model, metadata, where)
    # The state dict's names: a transformers model's are its own (worker/models/hf.py).
    params = model.state_dict()
    state = load_weights(checkpoint, device)
    for name, t in state.items():
        target = params.get(name)
        if target is not None and t.dtype != target.dtype:
            state[name] = t.to(target.dtype)
    try:
        access.load_model_state(model, state, strict)
    except RuntimeError as exc:
        raise CheckpointMismatch(
            f"checkpoint {where}: weights do not fit the model: {exc}"
        ) from exc
    if optimizers is not None:
        try:
            access.load_optimizer_state(model, optimizers, load_optimizer_state(checkpoint, device))
        except CheckpointMismatch as exc:
            raise CheckpointMismatch(f"checkpoint {where}: {exc}") from exc
    if scheduler is not None and metadata.get("scheduler"):
        scheduler.load_state_dict(metadata["scheduler"])
    return metadata


def check_model_fits(model: nn.Module, metadata: dict[str, Any], where: str) -> None:
    """Refuse a checkpoint saved by another architecture than `model`'s, naming both."""
    config, saved = getattr(model, "config", None), metadata.get("model_config")
    if isinstance(config, ModelConfig | HfModelConfig | PluginModelConfig) and isinstance(
        saved, dict
    ):
        check_fits(model_config_from_dict(saved), config, f"checkpoint {where}")


def load_weights(checkpoint: Files, device: torch.device | str) -> dict[str, torch.Tensor]:
    """The weights file, read from the file the storage opened the same way as the manifest
    check: no link followed, and a file swapped after the check is not what loads. A local
    file is mapped (safetensors reads it by the reader's path); any other is read whole."""
    with checkpoint.open(MODEL_FILE) as f:
        if f.local_path is not None:
            return load_file(f.local_path, device=str(device))
        return {k: t.to(device) for k, t in load(f.read()).items()}


def load_optimizer_state(checkpoint: Files, device: torch.device | str) -> dict[str, Any]:
    where = checkpoint.describe()
    try:
        with checkpoint.open(OPTIMIZER_FILE) as f:
            state = torch.load(cast(IO[bytes], f), map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointCorrupt(
            f"checkpoint {where}: {OPTIMIZER_FILE} holds objects other than tensors and "
            f"plain data; refusing to unpickle it ({exc})"
        ) from exc
    # Keyed by optimizer name (worker.training.optim.Optimizers.state_dict), each a state dict.
    if not isinstance(state, dict) or not all(isinstance(v, dict) for v in state.values()):
        raise CheckpointCorrupt(
            f"checkpoint {where}: {OPTIMIZER_FILE} holds no optimizer state by name"
        )
    return state


RETENTION_WAITS: tuple[type[Exception], ...] = (*UNAVAILABLE, LeaseExpired)


def retain_after(
    store: CheckpointStore, experiment: str, tag: str, max_keep: int, protected: Protection
) -> None:
    """The retention after a committed save. What is protected lives in the run database and
    is asked only with the lease confirmed: without the database, or with the lease run out
    while it did not answer, nothing is deleted, and the save stands (it was committed under
    the lease); the next save's retention deletes what this one would have. A worker that
    lost its lease to another attempt still stops (LeaseLost)."""
    try:
        store.retain(experiment, max_keep, protected=protected)
    except RETENTION_WAITS as exc:
        log.warning("retention after %s/%s waits: %s", experiment, tag, exc)

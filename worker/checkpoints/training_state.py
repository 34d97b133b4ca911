"""What a checkpoint is taken from, and what it records besides the tensors.

`TrainingState` is the one record every layout captures from (`capture_checkpoint`,
`worker.checkpoints.sharded.capture_sharded`): the built parts (model, optimizers, schedule),
where the run is (`Progress`: what a resume starts from), and whose it is. The metadata
document (`checkpoint_metadata`: step, tokens, best loss, schedule, data position, RNG state,
versions) is one for whole and sharded checkpoints, and `Progress.saved_in` reads back what it
wrote.
"""

from __future__ import annotations

import base64
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata as importlib_metadata
from typing import Any

import safetensors
import torch
from torch import nn

from trainctl.store.data.mixtures import (
    SOURCES_KEY,
    SourcePosition,
    continue_sources,
    read_sources,
    sources_metadata,
)
from trainctl.store.names import step_tag
from trainctl.worker.training.optim import Optimizers
from trainctl.worker.training.schedule import WSDScheduler

FORMAT_VERSION = 1


def versions() -> dict[str, str]:
    def version_of(dist: str) -> str:
        try:
            return importlib_metadata.version(dist)
        except importlib_metadata.PackageNotFoundError:
            return "unknown"

    return {
        "trainctl": version_of("trainctl"),
        "torch": torch.__version__,
        "safetensors": safetensors.__version__,
        "python": platform.python_version(),
    }


def capture_rng_state() -> dict[str, Any]:
    def b64(t: torch.Tensor) -> str:
        return base64.b64encode(t.numpy().tobytes()).decode()

    state: dict[str, Any] = {"torch": b64(torch.get_rng_state())}
    if torch.cuda.is_available():
        state["cuda"] = [b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    def tensor(s: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)

    torch.set_rng_state(tensor(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensor(s) for s in state["cuda"]])


def rank_rng(metadata: dict[str, Any], rank: int) -> dict[str, Any]:
    """The RNG state rank `rank` restores: its own at the world size that saved a sharded
    checkpoint (`rng_per_rank`), else rank 0's (another world size draws other numbers anyway)."""
    per_rank = metadata.get("rng_per_rank")
    if isinstance(per_rank, list) and metadata.get("world_size") == len(per_rank) > rank:
        return per_rank[rank]
    return metadata["rng"]


@dataclass
class Progress:
    """Where a run is, besides its tensors: what a checkpoint records of it and a resume
    starts from (`Progress.saved_in`)."""

    step: int = 0
    token_count: int = 0
    best_loss: float | None = None
    data_position: int = 0
    """Micro-batches read so far: a batch is a pure function of (seed, position)."""
    sources: list[SourcePosition] = field(default_factory=list)
    """A mixture's datasets at `data_position`: the rest of the data position (one run of a
    mixture, "Data mixtures"); [] for one source."""
    skipped_windows: dict[int, int] = field(default_factory=dict)
    """Data windows [start, end) a loss-health rewind skipped, by start: the rest of the data
    position, so that a resume skips them too (worker.training.health)."""
    health: dict[str, Any] = field(default_factory=dict)
    """The loss-health record at this step (`LossHealth.state_dict`); {} before any step."""

    @classmethod
    def saved_in(cls, metadata: dict[str, Any], folders: Sequence[str]) -> Progress:
        """The progress a checkpoint's metadata records, a mixture of `folders` continuing
        from it (`continue_sources`: a resume and a fork alike)."""
        return cls(
            step=int(metadata["step"]),
            token_count=int(metadata["token_count"]),
            best_loss=metadata.get("best_loss"),
            data_position=int(metadata["data_position"]),
            sources=continue_sources(read_sources(metadata), folders),
            skipped_windows={int(a): int(b) for a, b in metadata.get("skipped_windows", [])},
            health=dict(metadata.get("health") or {}),
        )


@dataclass
class TrainingState:
    """Everything a checkpoint is captured from, whatever its layout: the built parts, the
    run's progress, and whose checkpoint it is. It holds the live objects, no copies: a
    capture reads them at the step it is taken (see `worker.checkpoints.state.CheckpointState`).
    """

    model: nn.Module
    optimizers: Optimizers
    scheduler: WSDScheduler | None
    experiment: str
    progress: Progress = field(default_factory=Progress)
    run_id: str | None = None
    """The run that saves it (the store finds a requeued run's own checkpoints by it)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Joins the metadata: what the run trained on (a dataset's record)."""
    files: dict[str, bytes] = field(default_factory=dict)
    """Saved beside the weights, as they are: a bpe run's tokenizer.json
    (`CheckpointState.files`)."""

    def tag(self, tag: str | None = None) -> str:
        """The checkpoint's tag: `tag`, or the step's own (`step_<n>`)."""
        return tag or step_tag(self.progress.step)


def checkpoint_metadata(
    state: TrainingState,
    tag: str,
    *,
    dtype: torch.dtype | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """metadata.json of a checkpoint of `state` taken now (the RNG state included): one
    document for whole and sharded checkpoints (`worker.checkpoints.sharded`); `extra` (a
    layout's own entries) joins it after the state's."""
    model, progress = state.model, state.progress
    config = getattr(model, "config", None)
    sources = {SOURCES_KEY: sources_metadata(progress.sources)} if progress.sources else {}
    health: dict[str, Any] = {}
    if progress.skipped_windows:
        health["skipped_windows"] = sorted([a, b] for a, b in progress.skipped_windows.items())
    if progress.health:
        health["health"] = progress.health
    return {
        "format_version": FORMAT_VERSION,
        "step": progress.step,
        "token_count": progress.token_count,
        "best_loss": progress.best_loss,
        "scheduler": state.scheduler.state_dict() if state.scheduler is not None else None,
        "optimizer_kind": state.optimizers.kind,
        "model_config": config.to_dict() if config is not None else None,
        "data_position": progress.data_position,
        "rng": capture_rng_state(),
        "run_id": state.run_id,
        "experiment": state.experiment,
        "tag": tag,
        "dtype": str(dtype or next(model.parameters()).dtype).removeprefix("torch."),
        "created_at": datetime.now(UTC).isoformat(),
        "versions": versions(),
        **state.extra,
        **sources,
        **health,
        **(extra or {}),
    }

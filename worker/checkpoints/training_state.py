"""What a checkpoint records besides the tensors: the metadata document (step, tokens, best
loss, schedule, data position, RNG state, versions), one for whole and sharded checkpoints.
"""

from __future__ import annotations

import base64
import platform
from datetime import UTC, datetime
from importlib import metadata as importlib_metadata
from typing import Any

import safetensors
import torch
from torch import nn

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


def checkpoint_metadata(
    model: nn.Module,
    optimizers: Optimizers,
    scheduler: WSDScheduler | None,
    step: int,
    token_count: int,
    best_loss: float | None,
    experiment: str,
    tag: str,
    *,
    data_position: int = 0,
    run_id: str | None = None,
    dtype: torch.dtype | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """metadata.json of a checkpoint taken now (the RNG state included): one document for
    whole and sharded checkpoints (`worker.checkpoints.sharded`)."""
    config = getattr(model, "config", None)
    return {
        "format_version": FORMAT_VERSION,
        "step": step,
        "token_count": token_count,
        "best_loss": best_loss,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "optimizer_kind": optimizers.kind,
        "model_config": config.to_dict() if config is not None else None,
        "data_position": data_position,
        "rng": capture_rng_state(),
        "run_id": run_id,
        "experiment": experiment,
        "tag": tag,
        "dtype": str(dtype or next(model.parameters()).dtype).removeprefix("torch."),
        "created_at": datetime.now(UTC).isoformat(),
        "versions": versions(),
        **(extra or {}),
    }

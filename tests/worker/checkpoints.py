"""Test helpers over the checkpoint writer: a save in one call, and the latest step folder.

The worker itself captures a state at a step and writes it (`capture_checkpoint`,
`write_checkpoint`, or the asynchronous checkpointer); the tests that only need a checkpoint
on disk use these.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tests.stores import folder, posix_store
from trainctl.store.checkpoints.store import Protection
from trainctl.worker.checkpoint import capture_checkpoint, write_checkpoint
from trainctl.worker.optim import Optimizers
from trainctl.worker.schedule import WSDScheduler


def save_checkpoint(
    model: nn.Module,
    optimizers: Optimizers,
    scheduler: WSDScheduler | None,
    step: int,
    token_count: int,
    best_loss: float | None,
    save_dir: str | Path,
    max_keep: int | None = 3,
    tag: str | None = None,
    *,
    data_position: int = 0,
    run_id: str | None = None,
    dtype: torch.dtype | None = None,
    protected: Protection = frozenset(),
    extra: dict[str, Any] | None = None,
    files: dict[str, bytes] | None = None,
    before_commit: Callable[[], None] | None = None,
) -> Path:
    """Save into `save_dir/<tag>` (tag defaults to step_<step>) and return the folder.

    `save_dir` is an experiment folder of the store: `<data>/checkpoints/<experiment>`.
    `dtype=None` keeps the master dtype; `torch.bfloat16` exports a smaller, lossy copy.
    Retention (`max_keep` step checkpoints) runs only after the new one is committed.
    `before_commit` runs once the files are staged, just before they become visible; what it
    raises aborts the save (a worker checks there that it still owns its run).

    Raises `CheckpointWriteFailed` when the store cannot take the files (full, read-only);
    whatever fails, the staging folder is removed and earlier checkpoints are untouched.
    """
    save_dir = Path(save_dir)
    state = capture_checkpoint(
        model,
        optimizers,
        scheduler,
        step,
        token_count,
        best_loss,
        save_dir.name,
        tag,
        data_position=data_position,
        run_id=run_id,
        dtype=dtype,
        extra=extra,
        files=files,
    )
    store = posix_store(save_dir.parent)
    write_checkpoint(state, store, max_keep, protected, before_commit)
    return folder(store, state.experiment, state.tag)


def find_latest_checkpoint(save_dir: str | Path) -> Path | None:
    """The highest complete step_* checkpoint of an experiment folder, or None."""
    save_dir = Path(save_dir)
    if not save_dir.is_dir():
        return None
    store = posix_store(save_dir.parent)
    info = store.latest_or_none(save_dir.name)
    return folder(store, info.experiment, info.tag) if info is not None else None

"""Test helpers over the checkpoint writer: a save in one call, and the latest step folder; a
tiny model with its optimizers and schedule to save, and the tensors of a state_dict.

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

from tests.support.stores import folder, posix_store
from trainctl.store.checkpoints.store import Protection
from trainctl.store.training.optim import OptimizerSpec
from trainctl.worker.checkpoints.state import capture_checkpoint, write_checkpoint
from trainctl.worker.checkpoints.training_state import Progress, TrainingState
from trainctl.worker.models.gpt import GPT, build_model
from trainctl.worker.training.optim import Optimizers, build_optimizers
from trainctl.worker.training.schedule import WSDScheduler, build_scheduler

Parts = tuple[GPT, Optimizers, WSDScheduler]


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
    progress = Progress(step, token_count, best_loss, data_position)
    training = TrainingState(
        model, optimizers, scheduler, save_dir.name, progress, run_id, extra or {}, files or {}
    )
    state = capture_checkpoint(training, tag, dtype=dtype)
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


def make_parts(kind: str = "muon_adamw", **overrides: Any) -> Parts:
    model = build_model("tiny", seed=0, **overrides)
    optimizers = build_optimizers(model, OptimizerSpec(kind=kind))
    return model, optimizers, build_scheduler(optimizers, 100)


def save(parts: Parts, root: Path, step: int, **kw: object) -> Path:
    model, optimizers, sched = parts
    return save_checkpoint(model, optimizers, sched, step, step * 100, 2.5, root / "exp", **kw)  # type: ignore[arg-type]


def tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor in a nest of dicts, lists and tuples (a state_dict)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in tensors(v)]
    return []


def trained_model(tokens: list[int], steps: int = 8, **overrides: Any) -> GPT:
    """A `tiny` model after a few optimizer steps on `tokens`: its weights, norms included,
    are no longer at their initial values, so a mapping mistake cannot hide."""
    model = build_model("tiny", seed=0, **overrides)
    optimizers = build_optimizers(model)
    data = torch.tensor(tokens[: 4 * 65]).view(4, 65)
    for _ in range(steps):
        loss, _ = model.loss(data[:, :-1], data[:, 1:])
        torch.autograd.backward(loss)
        optimizers.step()
        optimizers.zero_grad()
    return model.eval()

"""How a train run's checkpoints are captured and written: the layout its strategy chose
(worker.training.parallelism `StrategyBuilder.saves`, which store.training.parallelism's
`checkpoint_layout` names; docs/design/checkpoints.md, "Sharded checkpoints").

- `FullSaves` (`full`): every rank captures the whole state (a strategy's `StateAccess` may
  gather it collectively), and rank 0 alone writes it, synchronously, or in the background
  from host buffers (worker.checkpoints.async_save) with `async_checkpoint` or once the run
  drains.
- `ShardedSaves` (`dcp`): every rank writes its own shards, in parallel
  (worker.checkpoints.sharded); with `async_checkpoint` in the background, its copy of them
  made while the next step's forward and backward run, and waited for only before the
  optimizers change them (`before_update`).

The trainer calls the one its strategy built, whichever it is. A save's `protected`,
`before_commit` and `after_commit` are the run's (`TrainerHooks`), asked on rank 0 at its
commit; `save`, `poll` and `wait` return the saves committed since the last call, each the
info the trainer's `on_checkpoint` hears (with its `path` and `save_seconds`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from trainctl.store.checkpoints.manifests import DCP_LAYOUT, FULL_LAYOUT
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.kinds.train import TrainPlan
from trainctl.worker.checkpoints.async_save import AsyncCheckpointer
from trainctl.worker.checkpoints.state import (
    CheckpointState,
    StateAccess,
    capture_checkpoint,
    write_checkpoint,
)
from trainctl.worker.checkpoints.training_state import TrainingState
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.parallel import rank_and_world

if TYPE_CHECKING:
    from trainctl.worker.checkpoints.async_sharded import AsyncShardedCheckpointer


class RunSaves(Protocol):
    """A train run's checkpoint saves in its strategy's layout (see the module)."""

    layout: ClassVar[str]
    """The manifest's `layout` of what it writes: its strategy's `checkpoint_layout`."""
    before_update: Callable[[], None] | None
    """Runs just before the optimizers change the tensors (a background copy of them must be
    complete by then); None: nothing to wait for."""

    def save(self, state: TrainingState, tag: str | None = None) -> list[dict[str, Any]]:
        """Capture `state` now (every rank calls it, at the same step) and write it."""
        ...

    def poll(self) -> list[dict[str, Any]]: ...
    def wait(self, until: float | None = None) -> list[dict[str, Any]]:
        """The save in flight, committed; `until` (`time.monotonic()`): a drain's deadline."""
        ...


SavesFactory = Callable[[TrainPlan, CheckpointStore, TrainerHooks, StateAccess], RunSaves]
"""(the plan, its checkpoint store, the run's hooks, how the state is read) -> its saves,
built on every rank at once."""


def saved_info(state: TrainingState, tag: str) -> dict[str, Any]:
    """What `on_checkpoint` hears of a save at this step (its `path` and `save_seconds` are
    added once it is committed)."""
    return {"experiment": state.experiment, "tag": tag, "step": state.progress.step}


def committed(hooks: TrainerHooks, info: dict[str, Any]) -> Callable[[], None] | None:
    """`after_commit` of the save `info` describes, for the checkpoint writer."""
    after = hooks.after_commit
    return None if after is None else partial(after, info["tag"], info["step"])


class FullSaves:
    """Whole checkpoints, written by rank 0 (see the module)."""

    layout: ClassVar[str] = FULL_LAYOUT
    before_update: Callable[[], None] | None = None  # its copy is made in `save`, in order

    def __init__(
        self, plan: TrainPlan, store: CheckpointStore, hooks: TrainerHooks, access: StateAccess
    ) -> None:
        self.store, self.hooks, self.access, self.max_keep = store, hooks, access, plan.max_keep
        self.dtype = torch.bfloat16 if plan.save_dtype == "bfloat16" else None
        self.background = AsyncCheckpointer() if plan.async_checkpoint else None

    def save(self, state: TrainingState, tag: str | None = None) -> list[dict[str, Any]]:
        # Every rank: a strategy's StateAccess may gather the state collectively.
        captured = capture_checkpoint(state, tag, dtype=self.dtype, access=self.access)
        if rank_and_world()[0] != 0:
            return []
        return self.write(captured, saved_info(state, captured.tag))

    def gate_and_confirm(self) -> None:
        """What a write runs just before its commit: a drain that gave up on the save refuses
        it (worker.checkpoints.async_save), then `before_commit` (the lease check)."""
        AsyncCheckpointer.commit_gate()
        if self.hooks.before_commit is not None:
            self.hooks.before_commit()

    def write(self, state: CheckpointState, info: dict[str, Any]) -> list[dict[str, Any]]:
        """Write and commit a captured state, here or in the background."""
        if self.background is None and self.hooks.draining():
            # The fastest path a stopping run has: stage to host memory now, let the ranks
            # stop, and write until the drain's deadline (Trainer.finish_saves).
            self.background = AsyncCheckpointer()

        def write(state: CheckpointState) -> str:
            # `protected` is asked under the store's guard, after the commit: a run queued
            # meanwhile that depends on an older checkpoint keeps it.
            started = time.perf_counter()
            where = write_checkpoint(
                state, self.store, self.max_keep, self.hooks.protected, self.gate_and_confirm,
                committed(self.hooks, info),
            )  # fmt: skip
            info["save_seconds"] = time.perf_counter() - started  # reported with the commit
            return where

        if self.background is None:
            where = write(state)  # before `info` is read: the write adds its save_seconds
            return [{**info, "path": where}]
        # Asynchronous: the loop goes on once the state is copied; the commit is reported
        # when it has happened (poll, wait).
        return self.background.save(state, write, info)

    def poll(self) -> list[dict[str, Any]]:
        return self.background.poll() if self.background is not None else []

    def wait(self, until: float | None = None) -> list[dict[str, Any]]:
        """The save in flight, committed: a draining run's only until its deadline (a later
        one is abandoned: SaveAbandoned)."""
        return self.background.wait(until=until) if self.background is not None else []


class ShardedSaves:
    """Sharded checkpoints, every rank writing its own shards (see the module)."""

    layout: ClassVar[str] = DCP_LAYOUT

    def __init__(
        self, plan: TrainPlan, store: CheckpointStore, hooks: TrainerHooks, access: StateAccess
    ) -> None:
        self.store, self.hooks, self.max_keep = store, hooks, plan.max_keep
        self.background: AsyncShardedCheckpointer | None = None
        self.before_update: Callable[[], None] | None = None
        if plan.async_checkpoint:
            # Here, not at the top: torch.distributed.checkpoint costs every other run's
            # import. Built on every rank at once: it makes a process group of its own.
            from trainctl.worker.checkpoints.async_sharded import AsyncShardedCheckpointer

            self.background = AsyncShardedCheckpointer(staging="background")
            self.before_update = self.background.wait_staged

    def save(self, state: TrainingState, tag: str | None = None) -> list[dict[str, Any]]:
        from trainctl.worker.checkpoints.sharded import capture_sharded, write_sharded

        captured = capture_sharded(state, tag)
        info = saved_info(state, captured.tag)
        # `protected` and `before_commit` are asked on rank 0, at its commit (finish_save).
        commit: dict[str, Any] = {
            "max_keep": self.max_keep,
            "protected": self.hooks.protected,
            "before_commit": self.hooks.before_commit,
            "after_commit": committed(self.hooks, info),
        }
        if self.background is not None:
            return self.background.save(captured, self.store, info=info, **commit)
        started = time.perf_counter()
        where = write_sharded(captured, self.store, **commit)
        return [{**info, "save_seconds": time.perf_counter() - started, "path": where}]

    def poll(self) -> list[dict[str, Any]]:
        return self.background.poll() if self.background is not None else []

    def wait(self, until: float | None = None) -> list[dict[str, Any]]:
        """The save in flight, committed, deadline or not: the ranks commit a sharded save
        together, so none of them gives up on it alone."""
        return self.background.wait() if self.background is not None else []

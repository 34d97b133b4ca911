"""The worker's side of the data-parallel strategies (store.training.parallelism): a builder per
strategy name, which turns a freshly built model into rank `rank`'s share of the run before
the optimizers are built over its parameters (worker.training.loop.build_training).

A new strategy is a record in store.training.parallelism and a builder here, or a plug-in's,
declared under the entry-point groups `trainctl.parallel_strategies` (its record) and
`trainctl.strategies` (its builder). The builder also chooses how the strategy's checkpoints
are written (`StrategyBuilder.saves`), in the layout its record names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.kinds.train import TrainPlan
from trainctl.store.registry import Registry
from trainctl.store.training.parallelism import (
    PARALLEL_STRATEGIES,
    DDPSettings,
    FSDPSettings,
    ParallelismSpec,
)
from trainctl.worker.checkpoints.saves import FullSaves, RunSaves, SavesFactory, ShardedSaves
from trainctl.worker.checkpoints.state import StateAccess
from trainctl.worker.models.gpt import GPT
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.parallel import DataParallel, DDPReplica


@dataclass(frozen=True)
class StrategyBuilder:
    """How the worker runs one strategy."""

    wrap: Callable[[nn.Module, torch.device, int, Any, Any], DataParallel]
    """(model, device, world size, the strategy's settings (the model its record names,
    store.training.parallelism), the plan's model config) -> this rank's `DataParallel`; it
    may change the model in place (shard it)."""
    model_runtime: dict[str, Any] = field(default_factory=dict)
    """Switches the model is built with (worker.models.build_model): fsdp compiles each
    block itself, so not the whole model."""
    saves: SavesFactory = FullSaves
    """How its checkpoints are captured and written (worker.checkpoints.saves): whole ones
    by rank 0 (`FullSaves`), or every rank its own shards (`ShardedSaves`), in the layout its
    record names (store.training.parallelism `checkpoint_layout`)."""


STRATEGY_BUILDERS: Registry[StrategyBuilder] = Registry(
    "parallel strategy builder", group="trainctl.strategies"
)


def _fsdp(
    model: nn.Module, device: torch.device, world: int, settings: FSDPSettings, config: Any
) -> DataParallel:
    # Imported here: torch.distributed.checkpoint costs every other run's import, and probes
    # for optional modules the GPU image lacks.
    from trainctl.worker.training.fsdp import FSDPShards

    compiled = getattr(config, "use_compile", False)
    return FSDPShards(
        model,
        device,
        world,
        reshard_after_forward=settings.reshard_after_forward,
        compile_mode=getattr(config, "compile_mode", "default") if compiled else None,
    )


def _ddp(
    model: nn.Module, device: torch.device, world: int, settings: DDPSettings, config: Any
) -> DataParallel:
    return DDPReplica(cast(GPT, model), device, world)


STRATEGY_BUILDERS.register("ddp", StrategyBuilder(_ddp))
STRATEGY_BUILDERS.register("fsdp", StrategyBuilder(_fsdp, {"use_compile": False}, ShardedSaves))


@dataclass(frozen=True)
class Ranks:
    """The ranks a train run's model is built for: how many, and the plan's strategy."""

    world: int
    spec: ParallelismSpec

    @property
    def builder(self) -> StrategyBuilder:
        return STRATEGY_BUILDERS.get(self.spec.strategy)

    def wrap(self, model: nn.Module, device: torch.device, config: Any) -> DataParallel:
        return self.builder.wrap(model, device, self.world, self.spec.settings(), config)

    def saves(
        self, plan: TrainPlan, store: CheckpointStore, hooks: TrainerHooks, access: StateAccess
    ) -> RunSaves:
        """The run's checkpoint saves, in its strategy's layout; a builder that writes
        another layout than its record names is refused (the store checks a request against
        the record's: a `save_dtype` only a full checkpoint keeps)."""
        saves = self.builder.saves(plan, store, hooks, access)
        declared = PARALLEL_STRATEGIES.get(self.spec.strategy).checkpoint_layout
        if saves.layout != declared:
            raise ValueError(
                f"parallel strategy {self.spec.strategy!r} writes {saves.layout!r} checkpoints "
                f"but its record (store.training.parallelism) says {declared!r}"
            )
        return saves

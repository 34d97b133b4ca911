"""The `replicas` strategy's builder (the worker's side): DDP replicas, sharded saves."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from trainctl.store.training.parallelism import DDPSettings
from trainctl.worker.checkpoints.saves import ShardedSaves
from trainctl.worker.models.gpt import GPT
from trainctl.worker.training.parallel import DataParallel, DDPReplica
from trainctl.worker.training.parallelism import StrategyBuilder


def replicate(
    model: nn.Module, device: torch.device, world: int, settings: DDPSettings, config: Any
) -> DataParallel:
    return DDPReplica(cast(GPT, model), device, world)


BUILDER = StrategyBuilder(replicate, saves=ShardedSaves)

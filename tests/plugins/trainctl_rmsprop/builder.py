"""The `rmsprop` kind's builder (worker side)."""

from __future__ import annotations

import torch
from torch import nn

from trainctl.worker.training.optim import Groups, OptimizerBuilder

from .kind import RMSpropSettings


def rmsprop_groups(model: nn.Module) -> Groups:
    return {"rmsprop": [p for p in model.parameters() if p.requires_grad]}


def build_rmsprop(groups: Groups, settings: RMSpropSettings) -> dict[str, torch.optim.Optimizer]:
    optimizer = torch.optim.RMSprop(
        groups["rmsprop"], lr=settings.rmsprop_lr, alpha=settings.rmsprop_alpha
    )
    return {"rmsprop": optimizer}


BUILDER = OptimizerBuilder(rmsprop_groups, build_rmsprop)

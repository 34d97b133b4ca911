"""The `rmsprop` kind's record and settings (store side: no torch)."""

from __future__ import annotations

from pydantic import Field, StrictFloat

from trainctl.store.training.choice import KindSettings
from trainctl.store.training.optim import OptimizerKind


class RMSpropSettings(KindSettings):
    rmsprop_lr: StrictFloat = Field(1e-3, gt=0, le=1, description="RMSprop learning rate.")
    rmsprop_alpha: StrictFloat = Field(
        0.99, ge=0, lt=1, description="RMSprop's smoothing of the squared gradients."
    )


RMSPROP = OptimizerKind(
    name="rmsprop",
    description="RMSprop for every parameter (a test plug-in)",
    settings=RMSpropSettings,
    state_per_param=1,  # the running mean of the squared gradients
)

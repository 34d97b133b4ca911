"""Errors the training core raises on purpose, with messages a user can act on."""

from trainctl.store.exceptions import (
    CheckpointCorrupt,
    CheckpointMismatch,
    LeaseLost,
    TrainctlError,
)


class CheckpointWriteFailed(TrainctlError):
    """A save could not be written (store full, read-only, gone); nothing of it is visible."""


class DoesNotFit(TrainctlError):
    """The model, counted when built at claim, needs more memory than this worker has."""


class LeaseExpired(LeaseLost):
    """The lease ran out while the run database did not answer: the run may be reaped at any
    moment, so it stops without saving or reporting (docs/design/runs.md, "Database
    outages")."""


class RunStopped(Exception):
    """Raised inside a run's inner loop (`worker.stops.maybe_stop`) once the run is asked to
    stop (cancel, drain, lost lease); `execute` turns it into the stopped outcome. Not a
    TrainctlError: it is no failure, and no handler of errors may take it for one."""


class NonFiniteLoss(TrainctlError):
    """Training diverged; the step's update was not applied and nothing was saved."""


class LossSpikes(TrainctlError):
    """The loss spiked again after as many rewinds as the run may make
    (`health.rewind.max_rewinds`); the spike's update was not applied."""


__all__ = [
    "CheckpointCorrupt",
    "CheckpointMismatch",
    "CheckpointWriteFailed",
    "DoesNotFit",
    "LeaseExpired",
    "LossSpikes",
    "NonFiniteLoss",
    "RunStopped",
]

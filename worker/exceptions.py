"""Errors the training core raises on purpose, with messages a user can act on."""

from store.exceptions import CheckpointCorrupt, InvalidRequest, TrainctlError


class CheckpointMismatch(InvalidRequest):
    """A checkpoint was made by a model of another shape than the one loading it."""


class CheckpointWriteFailed(TrainctlError):
    """A save could not be written (store full, read-only, gone); nothing of it is visible."""


class NonFiniteLoss(TrainctlError):
    """Training diverged; the step's update was not applied and nothing was saved."""


class StopRequested(TrainctlError):
    """The stop flag was set; the loop ended at a step boundary."""


__all__ = [
    "CheckpointCorrupt",
    "CheckpointMismatch",
    "CheckpointWriteFailed",
    "NonFiniteLoss",
    "StopRequested",
]

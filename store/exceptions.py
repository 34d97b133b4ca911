"""Domain errors of the store. The service maps each to one HTTP status in one place
(docs/architecture.md, "Rooms").

Messages are written for the user who will read them: say what is wrong and what to do.
"""


class TrainctlError(Exception):
    """Base of every error trainctl raises on purpose."""


class NotFound(TrainctlError):
    """Something the caller named does not exist (HTTP 404)."""


class Conflict(TrainctlError):
    """The request is valid but clashes with current state (HTTP 409)."""


class QueueFull(TrainctlError):
    """Too many runs are queued; the client should retry later (HTTP 429)."""


class Forbidden(TrainctlError):
    """The caller's token is valid but its scope does not allow this (HTTP 403)."""


class InvalidRequest(TrainctlError, ValueError):
    """The request itself is wrong (HTTP 422).

    Also a ValueError, so that raised inside a pydantic validator it becomes a validation
    error that names the field.
    """


class RunNotFound(NotFound):
    def __init__(self, run_id: str, why: str = "") -> None:
        super().__init__(f"run {run_id!r} does not exist" + (f"; {why}" if why else ""))


class AmbiguousRunId(Conflict):
    """A short id (a prefix of run ids) that several runs share: it named one run until the
    second was queued, so it is the runs' state, not the request, that refuses it (HTTP 409)."""

    def __init__(self, prefix: str, count: int) -> None:
        super().__init__(
            f"run id prefix {prefix!r} matches {count} runs; give more of the id, or all of it"
        )


class CheckpointNotFound(NotFound):
    pass


class ExperimentBusy(Conflict):
    def __init__(self, experiment: str, run_id: str) -> None:
        super().__init__(
            f"experiment {experiment!r} already has an active train run ({run_id}); "
            "cancel it or wait for it to finish"
        )


class CheckpointProtected(Conflict):
    pass


class DatasetExists(Conflict):
    """A prepare run's dataset name is taken (a dataset, or an active prepare run of it)."""


class ExportExists(Conflict):
    """An export run's folder is taken: that checkpoint is exported already."""


class RunNotCancellable(Conflict):
    pass


class InvalidName(InvalidRequest):
    pass


class UnknownPreset(InvalidRequest):
    pass


class CheckpointMismatch(InvalidRequest):
    """A checkpoint was made by a model of another shape than the one that would load it."""


class CheckpointCorrupt(TrainctlError):
    """A checkpoint on disk fails its manifest or does not match what loads it."""


class StorageUnavailable(TrainctlError):
    """The storage behind a store cannot be reached or refuses us (an object store's bucket,
    credentials, endpoint): the service's set-up, not a checkpoint's state. The message names
    the bucket and what to check, never a credential."""


class LeaseLost(TrainctlError):
    """A worker wrote to a run it no longer owns (its lease expired and was reaped)."""


class WorkerNotFound(NotFound):
    """A worker reported in under an id that is not registered (it was deregistered)."""

    def __init__(self, worker_id: str, hint: str = "register it again") -> None:
        super().__init__(f"worker {worker_id!r} is not registered; {hint}")


class InVariant(TrainctlError):
    """One variant of a sweep (`POST /runs/forks`) refused as its run alone would be: the
    same refusal, with the same HTTP status, naming the variant."""

    def __init__(self, index: int, cause: TrainctlError) -> None:
        super().__init__(f"variants.{index}: {cause}")
        self.index, self.cause = index, cause


class DatabaseStalled(TrainctlError):
    """The run database has not answered a probe for a while (a paused server, a frozen VM):
    a request that would query it is refused at once rather than left to wait with it
    (store/db/outages.py, `StallWatch`)."""

"""What an executor is: how a worker runs one claimed run of a kind with the training core and
says how it ended (docs/design/kinds.md, "Run kinds"). Each built-in kind's executor is its
module of worker/kinds/, listed in `worker.kinds.registry`; a plug-in kind's executor is
written with the same parts, imported from here: `read_plan`, `WorkerEnv`, `Outcome`.

An `Outcome` is what the worker loop then writes to the store: succeeded, cancelled, requeued
(graceful shutdown) or abandoned (the lease was lost, so the run is no longer ours to touch);
`member` is a gang member whose part ended while another member, the one holding global rank
0, reports the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

import torch
from pydantic import ValidationError

from trainctl.store.checkpoints.factory import Stores
from trainctl.store.db.rows import UNREADABLE
from trainctl.store.specs import Spec
from trainctl.store.worker_settings import WorkerSettings
from trainctl.worker.context import RunContext

P = TypeVar("P", bound=Spec)


@dataclass(frozen=True)
class WorkerEnv:
    """What an executor gets besides its run: the worker's own places."""

    stores: Stores
    """The checkpoint and export stores this worker reads and writes."""
    address: str | None = None
    """Where gang members on other nodes reach this worker (torchrun's rendezvous)."""
    memory_bytes: int | None = None
    """The memory a run may use here (a GPU's, or the host's, or the worker's budget): a
    transformers or plug-in model is admitted against it at claim (worker.training.memory)."""
    settings: WorkerSettings = field(default_factory=WorkerSettings)
    """The worker's settings, which a multi-process run's ranks get (worker.launch)."""


@dataclass
class Outcome:
    state: Literal["succeeded", "cancelled", "requeue", "abandoned", "member"]
    result: dict[str, Any] | None = None
    reason: str = ""


def stopped_outcome(ctx: RunContext, result: dict[str, Any]) -> Outcome:
    # The ranks of a distributed run agree on why they stopped; any member may have asked.
    reason = result.get("stop_reason") or ctx.stop_reason()
    if reason == "cancel":
        return Outcome("cancelled", result, "cancelled at the user's request")
    if reason == "shutdown":
        return Outcome("requeue", result, "worker shutting down; the run continues later")
    if reason == "lease_expired":
        return Outcome("abandoned", result, "the lease ran out while the database was away")
    if reason == "grow":
        return Outcome(
            "requeue", result, "elastic gang growing back: its missing workers are idle again"
        )
    return Outcome("abandoned", result, "lease lost")


def check_device(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the run needs a CUDA device but this worker has none")
    return torch.device("cuda" if device == "cuda" else "cpu")


def read_plan(ctx: RunContext, kind: type[P]) -> P:
    """The run's stored plan; one this worker cannot read fails the run, saying why."""
    unreadable = ctx.run.spec.get(UNREADABLE) if len(ctx.run.spec) == 1 else None
    if isinstance(unreadable, str):  # the store could not show the stored plan (rows.py)
        raise RuntimeError(f"{unreadable}; submit the run again")
    try:
        return cast(P, kind.model_validate(ctx.run.spec))  # mypy: Self of a bound union
    except ValidationError as exc:
        raise RuntimeError(
            f"this worker cannot read the run's stored plan (was it queued by another "
            f"trainctl version? submit it again): {exc}"
        ) from None


Executor = Callable[[RunContext, WorkerEnv], Outcome]

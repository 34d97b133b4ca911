"""What a run kind is: the record each kind declares (docs/design/kinds.md, "Run kinds").

A record says everything the rest of trainctl asks of a kind: its request and plan models,
how a request is resolved into a plan at submit (`resolve`, a reference loaded on first use),
what workers the plan needs (`placement`), how much memory it needs at its peak (`memory`,
None for the kinds whose memory is bounded by construction), whether it counts steps, and the
name of the executor a worker runs it with (`worker.kinds.registry.EXECUTORS`). Each built-in
kind declares its record in a module of its own on this shelf, beside its request, plan and
resolver; `store.kinds.registry` lists them. The placements several kinds share are here too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from trainctl.store.db.placement import Placement
from trainctl.store.plans import ForkPoint, Plan
from trainctl.store.registry import Ref
from trainctl.store.specs import Request, Spec
from trainctl.store.training import memory

if TYPE_CHECKING:
    from trainctl.store.resolve import SubmitContext


@dataclass(frozen=True)
class RunKind:
    """Everything trainctl needs to know of one kind of run."""

    name: str
    """The kind's name: `POST /runs/<name>`, the run row's `kind`."""
    request: type[Request]
    """What a client sends."""
    plan: type[Spec]
    """What a worker runs: a frozen model with `filed_under` (the experiment the run is
    listed under) and `depends_on` (the checkpoint it pins, or None)."""
    summary: str
    """The submit route's one line in the API docs."""
    resolve: Ref[Callable[[Any, SubmitContext], Plan]]
    """Request and submit context -> plan; raises InvalidRequest (422) or Conflict (409)."""
    placement: Callable[[Any], Placement]
    """Plan -> the workers it needs."""
    memory: Callable[[Any, int | None], memory.MemoryNeed] | None
    """(Plan, real parameter count or None) -> its peak memory per process; None where
    nothing can be too large. Submit estimates the count from the config; a worker that
    built the model on the meta device passes the real one (worker/training/memory.py)."""
    has_steps: bool
    """Whether its progress counts steps to a total (a progress bar can show it)."""
    executor: str
    """The worker's executor for it, by name (worker.kinds.registry.EXECUTORS)."""
    parent: Callable[[Any], ForkPoint | None] | None = None
    """Plan -> where the run was forked from, its lineage; None: runs of this kind are
    never forks."""


class OnOneDevice(Protocol):
    """A plan that names the one device it runs on."""

    @property
    def device(self) -> str: ...


def one_device(plan: OnOneDevice) -> Placement:
    """One GPU, or one CPU process, on one node."""
    return Placement(gpus_per_node=1 if plan.device == "cuda" else 0)


def one_cpu(plan: Spec) -> Placement:
    """One CPU process on one node."""
    return Placement()

"""Queueing a run from its request, wherever the request comes from (docs/design/kinds.md,
"Run kinds"; docs/design/checkpoints.md, "Protection"): a client's submit (`service.submit`), or a
train run's worker queueing the evaluate runs of its checkpoints (`store.evals.side_runs`).

Either way the kind's record resolves the request into its plan, the plan says where it runs
and what it pins, and the run is enqueued under the protection policy's pin of the
checkpoints it reads, so none can be deleted between resolving and enqueueing. What only a
client's submit does (admission against the service's settings, the queue limits, the
idempotency key) stays with the service.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

from trainctl.store.checkpoints.protection import ProtectionPolicy
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.placement import Placement
from trainctl.store.db.records import Run, RunToQueue
from trainctl.store.db.runs import RunStore
from trainctl.store.kinds.registry import RUN_KINDS, placement_of
from trainctl.store.plans import Plan
from trainctl.store.resolve import SubmitContext
from trainctl.store.specs import Request

Admit = Callable[[Any, Placement], None]
"""(plan, placement) -> None, or raises: the service's checks of a plan against what its
workers have (`service.submit.plan_run`)."""


def resolve_run(
    kind: str,
    request: Request,
    context: SubmitContext,
    *,
    max_attempts: int,
    admit: Admit | None = None,
) -> RunToQueue:
    """The request resolved by its kind's record into the run to queue: its plan, placement,
    priority, the checkpoint it pins and its lineage."""
    record = RUN_KINDS.get(kind)
    plan: Plan = record.resolve.load()(request, context)
    placement = placement_of(plan)
    if admit is not None:
        admit(plan, placement)
    ref = plan.depends_on
    return RunToQueue(
        kind,
        plan.filed_under,
        plan.model_dump(mode="json"),
        max_attempts=max_attempts,
        depends_on=((ref.experiment, ref.tag),) if ref else (),
        priority=request.priority,
        placement=placement,
        parent=record.parent(plan) if record.parent else None,
        launch={"slurm": request.slurm.model_dump(mode="json")} if request.slurm else None,
    )


def enqueue_pinned(
    queue: Sequence[RunToQueue], runs: RunStore, checkpoints: CheckpointStore, **enqueue: Any
) -> list[Run]:
    """Enqueue the runs of one request (`RunStore.enqueue_all`, given `enqueue`) under the
    protection policy's pin of every checkpoint they read, so none can be deleted between
    resolving and enqueueing. A run of a kind no record is registered for is refused here,
    before anything is queued: the database stores a kind's name and knows nothing of kinds."""
    for run in queue:
        if run.kind not in RUN_KINDS:
            raise ValueError(f"unknown run kind {run.kind!r}; expected one of {RUN_KINDS.names()}")
    policy = ProtectionPolicy(runs, checkpoints)
    with ExitStack() as pins:
        for experiment, tag in sorted({ref for run in queue for ref in run.depends_on}):
            pins.enter_context(policy.pinned(experiment, tag))
        return runs.enqueue_all(queue, **enqueue)

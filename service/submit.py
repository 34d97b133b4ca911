"""Submitting runs: resolve the request into a plan, enqueue the plan.

Everything a run needs is decided by `store.plans` at submit time, so a bad request is a 422
now rather than a failed run later. A plan that reads a checkpoint (a resume, a validation)
is enqueued under the protection policy's pin, so the checkpoint cannot be deleted between
resolving and enqueueing. A prepare run is refused (409) while another prepare run of the
same dataset name is queued or running, and an export while another export of the same
checkpoint is.

A run is queued with its placement (`store.plans.placement_of`: nodes, GPUs or CPU processes
per node), its priority and its attempts. It never fails for lack of GPUs: one that no live
worker can serve waits, and says why (`service.devices.waiting_reason`). Only a run that no
node could ever serve, more GPUs per node than TRAINCTL_MAX_GPUS_PER_NODE, is a 422.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import nullcontext

from trainctl.service.devices import cuda_available, memory_limit
from trainctl.service.settings import Settings
from trainctl.store.checkpoints.protection import ProtectionPolicy
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.runs import QueueLimits, Run, RunStore
from trainctl.store.db.tokens import Principal
from trainctl.store.exceptions import DatasetExists, ExportExists, InvalidRequest
from trainctl.store.memory import admit
from trainctl.store.placement import Placement
from trainctl.store.plans import ExportPlan, PreparePlan, RunPlan
from trainctl.store.resolve import (
    placement_of,
    resolve_benchmark,
    resolve_export,
    resolve_prepare,
    resolve_sample,
    resolve_train,
    resolve_validate,
)
from trainctl.store.specs import (
    BenchmarkRequest,
    ExportRequest,
    PrepareRequest,
    Request,
    SampleRequest,
    TrainRequest,
    ValidateRequest,
)
from trainctl.store.vocabulary import ACTIVE_STATES, RunKind


def request_digest(kind: str, request: Request) -> str:
    """What the client asked for, before any default is filled in."""
    body = json.dumps([kind, request.model_dump(mode="json", exclude_unset=True)], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def submit_run(
    kind: RunKind,
    request: Request,
    *,
    settings: Settings,
    runs: RunStore,
    ckpts: CheckpointStore,
    submitter: Principal | None = None,
    idempotency_key: str | None = None,
) -> Run:
    digest = request_digest(kind, request)
    if idempotency_key and (existing := runs.replay(idempotency_key, kind, digest)):
        return existing  # an idempotent retry gets its run, even if resolving now would differ
    plan = resolve(request, settings=settings, runs=runs, ckpts=ckpts)
    placement = placement_of(plan)
    check_gpus_per_node(placement, settings.max_gpus_per_node)
    # A prepare's memory is bounded by its batches; an export reads one checkpoint on a CPU.
    if not isinstance(plan, PreparePlan | ExportPlan):
        admit(plan, memory_limit(runs, settings.lease_seconds, plan.device))
    ref = plan.depends_on
    pin = ProtectionPolicy(runs, ckpts).pinned(ref.experiment, ref.tag) if ref else nullcontext()
    with pin:
        return runs.enqueue(
            kind,
            plan.filed_under,
            plan.model_dump(mode="json"),
            idempotency_key=idempotency_key,
            max_attempts=request.max_attempts or settings.max_attempts,
            priority=request.priority,
            placement=placement,
            depends_on=[(ref.experiment, ref.tag)] if ref else [],
            request_digest=digest if idempotency_key else None,
            submitted_by=submitter.name if submitter else None,
            queue_limits=QueueLimits(settings.max_queued_runs, settings.max_queued_runs_per_token),
        )


def check_gpus_per_node(placement: Placement, most: int | None) -> None:
    """A run asking for more GPUs per node than any node has (TRAINCTL_MAX_GPUS_PER_NODE)
    could never be claimed: a 422 now. Fewer always waits for a worker instead."""
    if most is not None and placement.gpus_per_node > most:
        raise InvalidRequest(
            f"nproc_per_node: the run needs {placement.gpus_per_node} GPUs per node, and no "
            f"node of this service has more than {most} (TRAINCTL_MAX_GPUS_PER_NODE); use at "
            f"most {most} per node, and more nodes (nnodes) to go wider"
        )


def resolve(
    request: Request, *, settings: Settings, runs: RunStore, ckpts: CheckpointStore
) -> RunPlan:
    roots, datasets = settings.data_roots, settings.datasets_dir
    if isinstance(request, PrepareRequest):
        plan = resolve_prepare(request, data_roots=roots, datasets_dir=datasets)
        refuse_a_second_prepare(runs, plan.name)
        return plan
    if isinstance(request, ExportRequest):
        export = resolve_export(request, checkpoints=ckpts, exports_dir=settings.exports_dir)
        refuse_a_second_export(runs, export)
        return export
    cuda = cuda_available(runs, settings.lease_seconds)
    if isinstance(request, SampleRequest):
        return resolve_sample(request, cuda_available=cuda, checkpoints=ckpts)
    if isinstance(request, TrainRequest):
        return resolve_train(
            request,
            cuda_available=cuda,
            data_roots=roots,
            checkpoints=ckpts,
            datasets_dir=datasets,
            default_trackers=settings.trackers,
            mlflow_configured=settings.mlflow_uri is not None,
        )
    if isinstance(request, ValidateRequest):
        return resolve_validate(
            request,
            cuda_available=cuda,
            data_roots=roots,
            checkpoints=ckpts,
            datasets_dir=datasets,
        )
    assert isinstance(request, BenchmarkRequest), f"no plan for a {type(request).__name__}"
    return resolve_benchmark(request, cuda_available=cuda)


def refuse_a_second_export(runs: RunStore, plan: ExportPlan) -> None:
    """Like a prepare: two exports of one checkpoint would race to publish one folder."""
    ref = plan.checkpoint
    for state in ACTIVE_STATES:
        active, _ = runs.list_runs(kind="export", state=state, experiment=ref.experiment, limit=500)
        for run in active:
            if run.spec.get("output") == plan.output:
                raise ExportExists(
                    f"checkpoint {ref} is being exported by run {run.id} ({state}); wait for "
                    "it, or cancel it"
                )


def refuse_a_second_prepare(runs: RunStore, name: str) -> None:
    """Two prepare runs of one name would race to publish it: the second is refused now.
    (Two submitted at the same moment may both pass; the later to finish then fails.)"""
    for state in ACTIVE_STATES:
        active, _ = runs.list_runs(kind="prepare", state=state, experiment=name, limit=1)
        if active:
            raise DatasetExists(
                f"name: dataset {name!r} is being prepared by run {active[0].id} ({state}); "
                "wait for it, or cancel it"
            )

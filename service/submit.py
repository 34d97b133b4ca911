"""Submitting runs: resolve the request into a plan, enqueue the plan.

Everything a run needs is decided by `store.plans` at submit time, so a bad request is a 422
now rather than a failed run later. A plan that reads a checkpoint (a resume, a validation)
is enqueued under the protection policy's pin, so the checkpoint cannot be deleted between
resolving and enqueueing.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import nullcontext

from trainctl.service.devices import cuda_available, memory_limit
from trainctl.service.settings import Settings
from trainctl.store.access import Principal
from trainctl.store.checkpoints import CheckpointStore
from trainctl.store.memory import admit
from trainctl.store.plans import Plan, resolve_benchmark, resolve_train, resolve_validate
from trainctl.store.protection import ProtectionPolicy
from trainctl.store.runs import QueueLimits, Run, RunStore
from trainctl.store.specs import BenchmarkRequest, Request, TrainRequest, ValidateRequest
from trainctl.store.vocabulary import RunKind


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
    admit(plan, memory_limit(runs, settings.lease_seconds, plan.device))
    ref = plan.depends_on
    pin = ProtectionPolicy(runs, ckpts).pinned(ref.experiment, ref.tag) if ref else nullcontext()
    with pin:
        return runs.enqueue(
            kind,
            plan.filed_under,
            plan.model_dump(mode="json"),
            idempotency_key=idempotency_key,
            max_attempts=settings.max_attempts,
            depends_on=[(ref.experiment, ref.tag)] if ref else [],
            request_digest=digest if idempotency_key else None,
            submitted_by=submitter.name if submitter else None,
            queue_limits=QueueLimits(settings.max_queued_runs, settings.max_queued_runs_per_token),
        )


def resolve(
    request: Request, *, settings: Settings, runs: RunStore, ckpts: CheckpointStore
) -> Plan:
    cuda = cuda_available(runs, settings.lease_seconds)
    roots, datasets = settings.data_roots, settings.datasets_dir
    if isinstance(request, TrainRequest):
        return resolve_train(
            request,
            cuda_available=cuda,
            data_roots=roots,
            checkpoints=ckpts,
            datasets_dir=datasets,
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

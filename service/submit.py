"""Submitting runs: resolve the request into a plan, admit it, enqueue it
(docs/design/kinds.md, "Run kinds" and docs/design/access.md, "Admission and access").

Everything a run needs is decided at submit time by its kind's resolver (store.kinds.registry), so a
bad request is a 422 now rather than a failed run later. A plan that reads a checkpoint (a resume,
a validation) is enqueued under the protection policy's pin, so the checkpoint cannot be
deleted between resolving and enqueueing.

A run is queued with its placement (nodes, GPUs or CPU processes per node), its priority and
its attempts. It never fails for lack of GPUs: one that no live worker can serve waits, and
says why (`service.presenters.waiting_reason`). Only a run that no node could ever serve,
more GPUs per node than TRAINCTL_MAX_GPUS_PER_NODE, is a 422.
"""

from __future__ import annotations

import hashlib
import json
from functools import partial
from typing import Any

from pydantic import BaseModel

from trainctl.service.backends.slurm import cluster_partitions
from trainctl.service.devices import cuda_available, memory_limit
from trainctl.service.settings import Settings
from trainctl.store.backends.slurm import check_partition, check_time_limit
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.bucket import DatasetStore
from trainctl.store.db.placement import Placement
from trainctl.store.db.records import Run, RunToQueue
from trainctl.store.db.runs import RunStore
from trainctl.store.db.submissions import QueueLimits
from trainctl.store.db.tokens import Principal
from trainctl.store.exceptions import InvalidRequest, InVariant, TrainctlError
from trainctl.store.kinds.registry import RUN_KINDS
from trainctl.store.kinds.sweeps import ForkSweepRequest
from trainctl.store.queueing import enqueue_pinned as queue_pinned
from trainctl.store.queueing import resolve_run
from trainctl.store.resolve import SubmitContext
from trainctl.store.specs import Request
from trainctl.store.training.memory import admit
from trainctl.store.vocabulary import SWEEP_NAME


def request_digest(kind: str, request: BaseModel) -> str:
    """What the client asked for, before any default is filled in."""
    body = json.dumps([kind, request.model_dump(mode="json", exclude_unset=True)], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def submit_run(
    kind: str,
    request: Request,
    *,
    settings: Settings,
    runs: RunStore,
    ckpts: CheckpointStore,
    exports: CheckpointStore,
    datasets: DatasetStore,
    submitter: Principal | None = None,
    idempotency_key: str | None = None,
) -> Run:
    digest = request_digest(kind, request)
    name = submitter.name if submitter else None
    if idempotency_key and (existing := runs.replay(idempotency_key, kind, digest, name)):
        return existing  # an idempotent retry gets its run, even if resolving now would differ
    context = submit_context(settings, runs, ckpts, exports, datasets)
    run = plan_run(kind, request, settings, runs, context)
    return enqueue_pinned([run], settings, runs, ckpts, idempotency_key, digest, name)[0]


def submit_sweep(
    sweep: ForkSweepRequest,
    *,
    settings: Settings,
    runs: RunStore,
    ckpts: CheckpointStore,
    exports: CheckpointStore,
    datasets: DatasetStore,
    submitter: Principal | None = None,
    idempotency_key: str | None = None,
) -> list[Run]:
    """Queue a sweep's forks, every one or none: each is resolved and admitted as a train
    run's submit would (a refusal names its variant), then all are enqueued at once."""
    digest = request_digest(SWEEP_NAME, sweep)
    name = submitter.name if submitter else None
    if idempotency_key and (
        existing := runs.replay_all(idempotency_key, "train", digest, name, len(sweep.variants))
    ):
        return existing  # the same body: the same number of runs, all queued together
    context = submit_context(settings, runs, ckpts, exports, datasets)
    queue = []
    for i, fork in enumerate(sweep.forks()):
        try:
            queue.append(plan_run("train", fork, settings, runs, context))
        except TrainctlError as exc:
            raise InVariant(i, exc) from exc
    return enqueue_pinned(queue, settings, runs, ckpts, idempotency_key, digest, name)


def plan_run(
    kind: str, request: Request, settings: Settings, runs: RunStore, context: SubmitContext
) -> RunToQueue:
    """The request resolved into its plan and admitted: the run to queue."""
    record = RUN_KINDS.get(kind)

    def admit_plan(plan: Any, placement: Placement) -> None:
        check_gpus_per_node(placement, settings.max_gpus_per_node)
        check_backend_options(request, placement, settings)
        if record.memory is not None:
            need = record.memory(plan, None)
            limit = memory_limit(
                runs.workers, settings.lease_seconds, need.device, settings.max_gpu_memory_bytes
            )
            admit(need, limit)

    return resolve_run(
        kind,
        request,
        context,
        max_attempts=request.max_attempts or settings.max_attempts,
        admit=admit_plan,
    )


def enqueue_pinned(
    queue: list[RunToQueue],
    settings: Settings,
    runs: RunStore,
    ckpts: CheckpointStore,
    idempotency_key: str | None,
    digest: str,
    submitted_by: str | None,
) -> list[Run]:
    """Enqueue the runs of one request under the pin of every checkpoint they read
    (`store.queueing`), within the service's queue limits."""
    return queue_pinned(
        queue,
        runs,
        ckpts,
        idempotency_key=idempotency_key,
        request_digest=digest if idempotency_key else None,
        submitted_by=submitted_by,
        queue_limits=QueueLimits(settings.max_queued_runs, settings.max_queued_runs_per_token),
    )


def submit_context(
    settings: Settings,
    runs: RunStore,
    ckpts: CheckpointStore,
    exports: CheckpointStore,
    datasets: DatasetStore,
) -> SubmitContext:
    """Where a request's names are looked up: the data roots and the stores (the datasets
    too: the data dir's, or the bucket's)."""
    return SubmitContext(
        data_roots=settings.data_roots,
        datasets=datasets,
        checkpoints=ckpts,
        exports=exports,
        runs=runs,
        cuda=partial(cuda_available, runs.workers, settings.lease_seconds),
        default_trackers=settings.trackers,
        mlflow_configured=settings.mlflow_uri is not None,
        wandb_project=settings.wandb_project,
    )


def check_backend_options(request: Request, placement: Placement, settings: Settings) -> None:
    """A run's `slurm` options mean something only to the Slurm backend. There, what Slurm
    would never run is refused: a time limit that leaves no time to train before the job's
    drain signal, a partition the cluster does not have, more nodes than it has."""
    if request.slurm is not None and settings.backend != "slurm":
        raise InvalidRequest(
            f"slurm: this service runs its runs on workers that claim them from the queue "
            f"(TRAINCTL_BACKEND={settings.backend}); slurm options need TRAINCTL_BACKEND=slurm"
        )
    if settings.backend != "slurm":
        return
    defaults = settings.slurm_defaults
    try:
        check_time_limit(request.slurm, defaults, settings.drain_seconds)
        partitions = cluster_partitions()
        if partitions is not None:
            check_partition(partitions, placement, request.slurm, defaults)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


def check_gpus_per_node(placement: Placement, most: int | None) -> None:
    """A run asking for more GPUs per node than any node has (TRAINCTL_MAX_GPUS_PER_NODE)
    could never be claimed: a 422 now. Fewer always waits for a worker instead."""
    if most is not None and placement.gpus_per_node > most:
        raise InvalidRequest(
            f"nproc_per_node: the run needs {placement.gpus_per_node} GPUs per node, and no "
            f"node of this service has more than {most} (TRAINCTL_MAX_GPUS_PER_NODE); use at "
            f"most {most} per node, and more nodes (nnodes) to go wider"
        )

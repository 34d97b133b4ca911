"""Plans for tests, resolved as the API would on a CPU-only node without data roots."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.support.stores import posix_store
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.kinds.benchmark import BenchmarkPlan, BenchmarkRequest, resolve_benchmark
from trainctl.store.kinds.registry import kind_of_plan, placement_of
from trainctl.store.kinds.train import TrainPlan, TrainRequest, resolve_train
from trainctl.store.kinds.validate import ValidatePlan, ValidateRequest, resolve_validate
from trainctl.store.plans import CheckpointRef

if TYPE_CHECKING:
    from trainctl.worker.runner import Worker


def train_plan(checkpoints: Path | None = None, **request: Any) -> TrainPlan:
    """A train plan; `checkpoints` is the store a `resume_from` is pinned in. Metrics every
    step unless `log_every` is given: most tests follow a run step by step."""
    store = posix_store(checkpoints) if checkpoints is not None else None
    request.setdefault("log_every", 1)
    return resolve_train(
        TrainRequest(**request), cuda_available=False, data_roots=[], checkpoints=store
    )


def benchmark_plan(**request: Any) -> BenchmarkPlan:
    return resolve_benchmark(BenchmarkRequest(**request), cuda_available=False)


def validate_plan(checkpoints: Path, **request: Any) -> ValidatePlan:
    return resolve_validate(
        ValidateRequest(**request),
        cuda_available=False,
        data_roots=[],
        checkpoints=posix_store(checkpoints),
    )


def enqueue(runs: RunStore, plan: TrainPlan | BenchmarkPlan | ValidatePlan, **kw: Any) -> Run:
    """Queue a plan as the API does (without the idempotency and protection checks)."""
    kw.setdefault("placement", placement_of(plan))
    kind = kind_of_plan(plan).name
    ref = plan.depends_on
    depends_on = [(ref.experiment, ref.tag)] if ref is not None else []
    return runs.enqueue(
        kind, plan.filed_under, plan.model_dump(mode="json"), depends_on=depends_on, **kw
    )


def enqueue_vanished_resume(runs: RunStore) -> Run:
    """A run pinned to a checkpoint that is gone by the time it starts: it must fail."""
    missing = CheckpointRef(experiment="x", tag="step_999")
    return enqueue(
        runs, train_plan(experiment="x", steps=5).model_copy(update={"resume_from": missing})
    )


def until_cancelled(experiment: str, **placement: Any) -> TrainPlan:
    """Tiny CPU ranks that train until the run is cancelled."""
    return train_plan(
        experiment=experiment,
        steps=100_000,
        model={"preset": "tiny"},
        data={"source": "synthetic"},
        batch={"micro_batch_size": 2, "seq_len": 32, "grad_accum_steps": 2},
        checkpoint_every=1_000_000,
        val_every=1_000_000,
        val_batches=1,
        **placement,
    )


def run_to_end(runs: RunStore, worker: Worker, plan: TrainPlan) -> Run:
    """Queue `plan`, and have `worker` (worker id "w1") claim and run it; the run once it has
    ended."""
    queued = enqueue(runs, plan)
    claimed = runs.claim("w1", lease_seconds=60)
    assert claimed is not None and claimed.id == queued.id
    worker.run_one(claimed)
    return runs.get(queued.id)

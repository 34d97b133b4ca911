"""Executes one claimed run of each kind with the training core and says how it ended.

An `Outcome` is what the worker loop then writes to the store: succeeded, cancelled, requeued
(graceful shutdown) or abandoned (the lease was lost, so the run is no longer ours to touch);
`member` is a gang member whose part ended while another member, the one holding global rank
0, reports the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import torch
from pydantic import ValidationError

from trainctl.store.checkpoints.factory import Stores
from trainctl.store.checkpoints.info import check_fits
from trainctl.store.data.bucket import BucketDatasets
from trainctl.store.data.prepare import PrepareStopped
from trainctl.store.db.rows import UNREADABLE
from trainctl.store.db.scores import checkpoint_results
from trainctl.store.evals.tasks import EvaluatePlan
from trainctl.store.kinds.registry import RUN_KINDS
from trainctl.store.plans import (
    BenchmarkPlan,
    CheckpointRef,
    ExportPlan,
    Plan,
    PreparePlan,
    SamplePlan,
    TrainPlan,
    ValidatePlan,
    bytes_per_token,
)
from trainctl.store.registry import Registry
from trainctl.store.specs import Spec
from trainctl.worker.checkpoints.exports import export_hf
from trainctl.worker.checkpoints.state import load_checkpoint
from trainctl.worker.context import RunContext
from trainctl.worker.data.loader import SyntheticSampler, TokenSampler
from trainctl.worker.data.prepare import prepare
from trainctl.worker.evals.side_runs import CheckpointEvals
from trainctl.worker.kinds.benchmark import run_benchmark
from trainctl.worker.kinds.evaluate import run_evaluate
from trainctl.worker.launch import launch_train
from trainctl.worker.models import build_model
from trainctl.worker.models.sampling import run_sample
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import Trainer, build_token_arrays, val_metrics
from trainctl.worker.training.memory import admit_at_claim
from trainctl.worker.training.validation import compute_validation_loss, validate_forward_shape

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
    return Outcome("abandoned", result, "lease lost")


def check_device(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the run needs a CUDA device but this worker has none")
    return torch.device("cuda" if device == "cuda" else "cpu")


def maybe_log_params(ctx: RunContext, params: int | None) -> None:
    if params is not None:
        ctx.log(f"the model has {params:,} parameters (counted at claim); it fits this worker")


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


def execute_train(ctx: RunContext, env: WorkerEnv) -> Outcome:
    plan = read_plan(ctx, TrainPlan)
    store, address = env.stores.checkpoints, env.address
    check_device(plan.device)
    gang = ctx.run.gang
    # Only this run writes to its experiment (one active train run each), so what is left
    # half-written there (a save killed mid-write, a commit cut between its renames) is
    # swept now rather than when the service next restarts; in a gang, by its leader alone
    # (nothing is saved before every member has joined the rendezvous).
    if gang is None or gang.node_rank == 0:
        for _, leftover in store.cleanup(plan.experiment):
            ctx.log(f"cleaned up {leftover} (left by an interrupted save)")
    # A run that was interrupted (worker killed, node drained) continues from its own last
    # checkpoint; the steps after it are recomputed, deterministically, from the same batches.
    previous = store.latest_of_run(plan.experiment, ctx.run.id)
    if previous is not None:
        ref = CheckpointRef(experiment=plan.experiment, tag=previous.tag)
        plan = plan.model_copy(update={"resume_from": ref})
        ctx.log(f"attempt {ctx.attempt}: resuming from {previous.tag} of this run")
    elif plan.resume_from is not None:
        ctx.log(f"resuming from checkpoint {plan.resume_from}")
    elif plan.fork_from is not None:
        ctx.log(f"forking from checkpoint {plan.fork_from.checkpoint} (step {plan.fork_from.step})")

    if gang is not None:
        ctx.log(
            f"joining the gang as node {gang.node_rank} of {gang.nnodes} with "
            f"{plan.nproc_per_node} processes (torchrun, rendezvous {gang.rendezvous})"
        )
        launched = launch_train(plan, env.stores.layout, ctx, address)
        if launched is None:
            return Outcome("member", reason="the member holding rank 0 reports the run")
        result = launched
    elif plan.nproc_per_node > 1:
        ctx.log(f"launching {plan.nproc_per_node} data-parallel processes (torchrun)")
        launched = launch_train(plan, env.stores.layout, ctx)
        assert launched is not None  # a single node's launch has rank 0
        result = launched
    else:
        evals = CheckpointEvals(plan, ctx, env.stores)
        hooks = TrainerHooks.of_run(ctx, store, plan.experiment, after_commit=evals)
        trainer = Trainer(plan, store, hooks=hooks, run_id=ctx.run.id)
        result = trainer.run()
        if plan.evals is not None:
            result["evaluate_runs"] = evals.queued
    result["experiment"] = plan.experiment
    if "drain" in result:
        # Not the store's latest: a drain hands back at once, and the store may be what
        # held its save up (an object store that stopped answering).
        maybe_log_drain(ctx, result["drain"])
    else:
        latest = store.latest_or_none(plan.experiment)
        result["checkpoint"] = latest.tag if latest else None
    ctx.progress(result["step"], plan.steps, force=True)
    return stopped_outcome(ctx, result) if result["stopped"] else Outcome("succeeded", result)


def maybe_log_drain(ctx: RunContext, drain: dict[str, Any]) -> None:
    """Say how the drain's save went, in seconds from the signal (the run's events)."""
    stopped = f"stopped {drain['stopped_seconds']:.2f} s after the signal"
    if drain["abandoned"]:
        ctx.log(f"drain: {stopped}; {drain['abandoned']}", level="warning", drain=drain)
    else:
        committed = drain["committed_seconds"]
        saved = "" if committed is None else f", its checkpoint committed at {committed:.2f} s"
        ctx.log(f"drain: {stopped}{saved}", drain=drain)


def execute_benchmark(ctx: RunContext, env: WorkerEnv) -> Outcome:
    plan = read_plan(ctx, BenchmarkPlan)
    check_device(plan.device)
    result = run_benchmark(plan, on_step=ctx.metrics, should_stop=ctx.should_stop)
    if result["total_tokens"] < plan.steps * plan.batch.tokens_per_step:
        return stopped_outcome(ctx, result)
    return Outcome("succeeded", result)


def validation_batches(plan: ValidatePlan, bucket: BucketDatasets | None = None) -> list[Any]:
    data, vocab_size = plan.data, plan.model.vocab_size
    if data.source == "synthetic":
        sampler: Any = SyntheticSampler(plan.batch_size, plan.seq_len, vocab_size, data.seed)
    else:
        # Same held-out data a train run on this source validates on.
        _, val_arrays = build_token_arrays(data, plan.dataset, bucket)
        sampler = TokenSampler(val_arrays, plan.batch_size, plan.seq_len, seed=data.seed + 1)
    return [sampler.batch(i) for i in range(plan.num_batches)]


def execute_validate(ctx: RunContext, env: WorkerEnv) -> Outcome:
    plan = read_plan(ctx, ValidatePlan)
    store = env.stores.checkpoints
    device = check_device(plan.device)
    ref = plan.checkpoint
    info = store.get(ref.experiment, ref.tag)
    ctx.log(f"validating checkpoint {ref} (step {info.step})")
    model = build_model(plan.model, device=device)
    load_checkpoint(model, None, None, store.entry(ref.experiment, ref.tag), device=device)
    shape = validate_forward_shape(model, device=device)
    autocast = torch.bfloat16 if device.type == "cuda" else None
    batches = validation_batches(plan, env.stores.datasets)
    val = compute_validation_loss(model, batches=batches, device=device, autocast_dtype=autocast)
    metrics = val_metrics(val, bytes_per_token(plan.data, plan.dataset))
    ctx.metrics({"kind": "val", **metrics})
    if "val_bits_per_byte" in metrics:
        val = {**val, "bits_per_byte": metrics["val_bits_per_byte"]}
    return Outcome(
        "succeeded",
        {
            **val,
            "checkpoint": {"experiment": ref.experiment, "tag": ref.tag, "step": info.step},
            "forward_shape": list(shape),
        },
    )


def execute_sample(ctx: RunContext, env: WorkerEnv) -> Outcome:
    plan = read_plan(ctx, SamplePlan)
    store = env.stores.checkpoints
    return Outcome("succeeded", run_sample(plan, ctx, store, check_device(plan.device)))


def execute_export(ctx: RunContext, env: WorkerEnv) -> Outcome:
    plan = read_plan(ctx, ExportPlan)
    checkpoints, exports = env.stores.checkpoints, env.stores.exports
    ref = plan.checkpoint
    info = checkpoints.get(ref.experiment, ref.tag)
    # A tag ('best') may have been saved again since submit: export what was asked for.
    check_fits(info.require_model_config(), plan.model, f"checkpoint {ref}")
    # What an export killed mid-write left in the exports store (the service sweeps it too).
    for _, leftover in exports.cleanup(ref.experiment):
        ctx.log(f"cleaned up {leftover} (left by an interrupted export)")
    ctx.log(f"exporting checkpoint {ref} (step {info.step}) as {plan.format}, {plan.dtype}")
    # The export is filed under the checkpoint's name in the exports store: plan.output names
    # that place as submit saw it.
    exported = export_hf(
        checkpoints.entry(ref.experiment, ref.tag),
        exports,
        ref.experiment,
        ref.tag,
        dtype=plan.dtype,
        facts={"export run": ctx.run.id},
        evals=checkpoint_results(ctx.runs, ref.experiment, ref.tag, info.step, info.run_id),
    )
    for difference in exported.differences:
        ctx.log(f"differs from trainctl: {difference}", level="warning")
    return Outcome(
        "succeeded",
        {
            **exported.to_dict(),
            "checkpoint": {"experiment": ref.experiment, "tag": ref.tag, "step": info.step},
            "export": {"experiment": ref.experiment, "tag": ref.tag},
        },
    )


def execute_evaluate(ctx: RunContext, env: WorkerEnv) -> Outcome:
    plan = read_plan(ctx, EvaluatePlan)
    store = env.stores.checkpoints
    result, complete = run_evaluate(plan, ctx, store, check_device(plan.device))
    return Outcome("succeeded", result) if complete else stopped_outcome(ctx, result)


def execute_prepare(ctx: RunContext, env: WorkerEnv) -> Outcome:
    plan = read_plan(ctx, PreparePlan)
    ctx.log(f"preparing dataset {plan.name} from {len(plan.inputs)} input files")
    try:
        result = prepare(plan, ctx, env.stores)
    except PrepareStopped:
        return stopped_outcome(ctx, {"dataset": plan.name})  # nothing of it is left
    return Outcome("succeeded", result)


Executor = Callable[[RunContext, WorkerEnv], Outcome]
EXECUTORS: Registry[Executor] = Registry("executor", group="trainctl.executors")
"""How a worker runs each kind of run, by the executor name its kind's record gives
(store.kinds.registry); a plug-in kind's executor is declared under the same entry-point group."""
for _name, _executor in {
    "train": execute_train,
    "benchmark": execute_benchmark,
    "validate": execute_validate,
    "prepare": execute_prepare,
    "sample": execute_sample,
    "export": execute_export,
    "evaluate": execute_evaluate,
}.items():
    EXECUTORS.register(_name, _executor)


def execute(ctx: RunContext, env: WorkerEnv) -> Outcome:
    """Run `ctx.run` with the executor its kind names, once it is admitted: a kind whose
    memory is estimated is counted again on the model it builds (worker.training.memory), before
    any of its work, whatever the kind."""
    kind = RUN_KINDS.get(ctx.run.kind)
    if kind.memory is not None:
        plan = cast(
            Plan, read_plan(ctx, kind.plan)
        )  # a kind's plan is a Plan (store.kinds.registry)
        maybe_log_params(ctx, admit_at_claim(plan, env.memory_bytes))
    return EXECUTORS.get(kind.executor)(ctx, env)

"""Train runs, torch half (docs/design/kinds.md, "Run kinds"): a claimed train run resumed
from its own last checkpoint where an earlier attempt left one, then trained on this worker's
one process, or launched across its processes and the gang's nodes (`worker.launch`); the
request, plan and resolver are store/kinds/train.py.
"""

from __future__ import annotations

from typing import Any

from trainctl.store.kinds.train import TrainPlan
from trainctl.store.plans import CheckpointRef
from trainctl.worker.context import RunContext
from trainctl.worker.evals.side_runs import CheckpointEvals, side_run_limits
from trainctl.worker.executor import Outcome, WorkerEnv, check_device, read_plan, stopped_outcome
from trainctl.worker.launch import launch_train
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import Trainer


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

    if gang is not None and gang.nnodes != plan.nnodes:
        # An elastic gang placed on fewer nodes (docs/design/placement.md, "Elastic gangs"):
        # the ranks split the same grad_accum_steps among fewer, so the global batch holds.
        plan = plan.model_copy(update={"nnodes": gang.nnodes})
    if gang is not None and gang.resized_from is not None:
        log_resize(ctx, gang.resized_from, gang.nnodes, previous.step if previous else None)
    if gang is not None:
        ctx.log(
            f"joining the gang as node {gang.node_rank} of {gang.nnodes} with "
            f"{plan.nproc_per_node} processes (torchrun, rendezvous {gang.rendezvous})"
        )
        launched = launch_train(plan, env.settings, ctx, address)
        if launched is None:
            return Outcome("member", reason="the member holding rank 0 reports the run")
        result = launched
    elif plan.nproc_per_node > 1:
        ctx.log(f"launching {plan.nproc_per_node} data-parallel processes (torchrun)")
        launched = launch_train(plan, env.settings, ctx)
        assert launched is not None  # a single node's launch has rank 0
        result = launched
    else:
        evals = CheckpointEvals(plan, ctx, env.stores, side_run_limits(env.settings))
        hooks = TrainerHooks.of_run(ctx, store, plan.experiment, after_commit=evals)
        trainer = Trainer(plan, store, hooks=hooks, run_id=ctx.run.id, datasets=env.stores.datasets)
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


def log_resize(ctx: RunContext, before: int, now: int, step: int | None) -> None:
    """The leader's report of an elastic gang placed on another number of nodes than its
    last attempt: `resize` is the data (from, to, and the checkpoint step it resumes from;
    None: from its start)."""
    how = "shrank" if now < before else "grew"
    where = f"step {step}" if step is not None else "its start"
    ctx.log(
        f"{how} from {before} to {now} nodes, resuming from {where} with the same global batch",
        level="warning" if now < before else "info",
        resize={"from": before, "to": now, "step": step},
    )


def maybe_log_drain(ctx: RunContext, drain: dict[str, Any]) -> None:
    """Say how the drain's save went, in seconds from the signal (the run's events)."""
    stopped = f"stopped {drain['stopped_seconds']:.2f} s after the signal"
    if drain["abandoned"]:
        ctx.log(f"drain: {stopped}; {drain['abandoned']}", level="warning", drain=drain)
    else:
        committed = drain["committed_seconds"]
        saved = "" if committed is None else f", its checkpoint committed at {committed:.2f} s"
        ctx.log(f"drain: {stopped}{saved}", drain=drain)

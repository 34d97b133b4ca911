"""A rank of a multi-process train run: what each of the N processes torchrun starts does
(`python -I … trainctl.worker.launch rank job.json`; the launcher, `worker.launch`, starts them
and reads what they leave in its folder).

Each rank reads the job file, joins the process group over the run's own store
(worker.rendezvous), and trains its share with a `RankTrainer`. Rank 0 alone talks to the run
store (events, progress, cancel, the lease check before a checkpoint commits) and writes
`result.json`; every rank stops at the same step (`AgreedStop`), for its worker's stop file or,
on rank 0, for the run's own reasons. A rank that fails writes `error.json` (local rank 0 of a
node without global rank 0), saying whether it lost its peers (`peer_lost`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from trainctl.store.checkpoints.factory import open_stores
from trainctl.store.db.runs import RunStore
from trainctl.store.kinds.train import TrainPlan
from trainctl.store.training.parallelism import PARALLEL_STRATEGIES
from trainctl.store.worker_settings import WorkerSettings
from trainctl.worker.context import RunContext
from trainctl.worker.drain import Shutdown
from trainctl.worker.evals.side_runs import CheckpointEvals, side_run_limits
from trainctl.worker.launch import DRAIN_FILE, ERROR_FILE, RESULT_FILE, STOP_FILE
from trainctl.worker.rendezvous import rank_store
from trainctl.worker.training.hangs import (
    BOARD_FILE,
    OwnClock,
    ProgressBoard,
    RankFault,
    RankPulse,
    RankWatches,
    StragglerWatch,
    rank_nodes,
    register_stack_dump,
    straggler_report,
)
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import Trainer
from trainctl.worker.training.parallel import AgreedStop, RankSampler
from trainctl.worker.training.parallelism import Ranks


class RankTrainer(Trainer):
    """A Trainer of rank `rank` of `world`, built for the plan's strategy (`Ranks`, before the
    optimizers), reading its share of the batches; only rank 0 reports and samples. Its
    checkpoints take the strategy's layout (worker.checkpoints.saves), whichever it is."""

    def __init__(self, plan: TrainPlan, *args: Any, rank: int, world: int, **kwargs: Any) -> None:
        self.rank = rank
        super().__init__(plan, *args, ranks=Ranks(world, plan.parallelism), **kwargs)
        self.parts.sampler = RankSampler(self.parts.sampler, rank, world)
        if rank != 0:
            self.samples = None  # rank 0 reports, and samples; the others wait at the next step


def rank_context(job: dict[str, Any], runs: RunStore) -> RunContext:
    """Rank 0's view of the run: the worker's identity and attempt, so its writes are fenced."""
    info, settings = job["run"], WorkerSettings.from_job(job["settings"], os.environ)
    # The attempt the worker claimed, not the row's current one: if the run has moved on,
    # the fenced writes must fail.
    run = dataclasses.replace(runs.get(info["id"]), attempt=info["attempt"])
    # Set once the worker asks to stop (see rank_stop), with the worker's deadline.
    shutdown = Shutdown(settings.drain_seconds)
    return RunContext(run, runs, settings.worker_id, shutdown, settings.lease_seconds)


def rank_stop(
    ctx: RunContext | None, stop_file: Path, grow: threading.Event | None = None
) -> Callable[[], str | None]:
    """A rank's own reason to stop: its worker's stop file, and on rank 0 cancel, the lease
    and an elastic gang's room to grow too."""

    def reason() -> str | None:
        asked = (stop_file.read_text() or "shutdown") if stop_file.exists() else None
        if ctx is None:
            return asked
        grown = "grow" if grow is not None and grow.is_set() else None
        return ctx.stop_reason() or asked or grown

    return reason


def drain_when_agreed(shutdown: Shutdown, workdir: Path) -> Callable[[str], None]:
    """Rank 0's run (its context's `shutdown`) starts its drain (the stop's save on the async
    path, with the deadline, and the drain's report) when the ranks agree on a shutdown, not
    when rank 0 reads its own stop file: another rank may be the one that asked, one of this
    node that read the file a moment after rank 0, or one of a gang member whose worker alone
    was signalled. The deadline counts from the moment this node's worker was told
    (DRAIN_FILE), else from now."""

    def agreed(reason: str) -> None:
        if reason == "shutdown":
            drain = workdir / DRAIN_FILE
            since = float(drain.read_text()) if drain.exists() else None
            shutdown.set(since)

    return agreed


def grow_watch(
    plan: TrainPlan,
    ctx: RunContext,
    grow: threading.Event,
    evals: Callable[[str, int], None] | None,
) -> Callable[[str, int], None]:
    """Rank 0's after-commit of an elastic gang (docs/design/placement.md, "Elastic gangs"):
    once its missing workers are idle again, set `grow`, so that every rank stops at the
    next step and the run is requeued to be placed on all its nodes; the checkpoint just
    committed is what it resumes from, and the last step's is not worth a restart."""

    def after_commit(tag: str, step: int) -> None:
        if evals is not None:
            evals(tag, step)
        if plan.min_nnodes is None or step >= plan.steps or grow.is_set():
            return
        if ctx.runs.room_to_grow(ctx.run.id, ctx.lease_seconds):
            ctx.log(f"elastic gang: its missing workers are idle; growing back after step {step}")
            grow.set()

    return after_commit


def run_rank(job_file: str) -> int:
    job = json.loads(Path(job_file).read_text())
    workdir = Path(job_file).parent
    plan = TrainPlan.model_validate(job["plan"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    stacks = register_stack_dump(workdir, rank)  # noqa: F841 (open while the rank lives)
    if plan.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda", torch.cuda.current_device()) if plan.device == "cuda" else None
    # The group's store is ours, bound to MASTER_ADDR alone (worker.rendezvous), not torch's
    # default one that listens on every interface.
    store = rank_store(rank, world, os.environ)
    dist.init_process_group(
        "nccl" if plan.device == "cuda" else "gloo", store=store, rank=rank, world_size=world
    )
    runs = RunStore(os.environ["TRAINCTL_DATABASE_URL"]) if "run" in job and rank == 0 else None
    report: dict[str, Any] | None = None
    try:
        report = train_rank(plan, job, rank, world, workdir, runs, device)
    except Exception as exc:
        error = {"type": type(exc).__name__, "message": str(exc), "peer_lost": peer_lost(exc)}
        report = {"error": error}
        if rank != 0 and int(os.environ["LOCAL_RANK"]) == 0:
            (workdir / ERROR_FILE).write_text(json.dumps(error))
        raise
    finally:
        if rank == 0 and report is not None:
            (workdir / RESULT_FILE).write_text(json.dumps(report, default=str))
        if runs is not None:
            runs.close()
        dist.destroy_process_group()
    return 0


def train_rank(
    plan: TrainPlan,
    job: dict[str, Any],
    rank: int,
    world: int,
    workdir: Path,
    runs: RunStore | None,
    device: torch.device | None,
) -> dict[str, Any]:
    metrics: list[dict[str, Any]] = []
    ctx = rank_context(job, runs) if runs is not None else None
    watches = rank_watches(plan, workdir, rank, device)
    settings = WorkerSettings.from_job(job["settings"], os.environ)
    # Every rank gathers, where every rank times its steps: the reports name the nodes.
    nodes = rank_nodes(settings.node) if watches.own is not None else []

    def report_stragglers(slow: dict[int, float]) -> None:
        message, data = straggler_report(slow, trainer.progress.step, plan.stragglers, nodes)
        assert ctx is not None
        ctx.log(message, level="warning" if slow else "info", straggler=data)

    # Rank 0 of a run watches the own step times; without a run (tests, scripts) nobody hears.
    timed = rank == 0 and ctx is not None and watches.own is not None
    watch = StragglerWatch(plan.stragglers, world, report_stragglers) if timed else None
    grow = threading.Event()
    stop = AgreedStop(
        rank_stop(ctx, workdir / STOP_FILE, grow),
        device or torch.device("cpu"),
        own_seconds=watches.own.seconds if watches.own is not None else None,
        on_times=watch.observe if watch is not None else None,
        on_agreed=drain_when_agreed(cast(Shutdown, ctx.shutdown), workdir) if ctx else None,
    )
    stores = open_stores(settings.layout, runs)
    store = stores.checkpoints
    evals = CheckpointEvals(plan, ctx, stores, side_run_limits(settings)) if ctx else None
    if rank != 0:  # rank 0 speaks for the run; every rank agrees on when to stop
        hooks = TrainerHooks.silent(stop)
    elif ctx is not None:
        after_commit = grow_watch(plan, ctx, grow, evals)
        hooks = TrainerHooks.of_run(
            ctx, store, plan.experiment, should_stop=stop, after_commit=after_commit
        )
    else:  # no run (tests, scripts), so none depends on a checkpoint: rank 0 returns its
        # metrics with the result
        hooks = TrainerHooks(on_metrics=metrics.append, should_stop=stop)
    trainer = RankTrainer(
        plan,
        store,
        rank=rank,
        world=world,
        hooks=hooks,
        run_id=ctx.run.id if ctx else None,
        datasets=stores.datasets,
        watches=watches,
    )
    if ctx is not None:
        ctx.reporter.start()  # rank 0 never waits on the database for a report either
    try:
        result = trainer.run() | {"stop_reason": stop.reason}
    finally:
        if ctx is not None:  # its reports before its result, which the worker records
            ctx.reporter.close(keep=not ctx.lease_lost.is_set())
    if evals is not None and plan.evals is not None:
        result["evaluate_runs"] = evals.queued
    return {"result": result if ctx else {**result, "metrics": metrics}}


def rank_watches(
    plan: TrainPlan, workdir: Path, rank: int, device: torch.device | None
) -> RankWatches:
    """What this rank does for the hang and straggler watches (worker.training.hangs): its
    slot of the launch's progress board, where the worker made one; its own step times,
    where a rank's forward runs without the others (not under fsdp)."""
    board = workdir / BOARD_FILE
    local_rank = int(os.environ["LOCAL_RANK"])
    pulse = (
        RankPulse(ProgressBoard(board, plan.nproc_per_node), local_rank, rank, plan.hang)
        if plan.hang.enabled and board.exists()
        else None
    )
    strategy = PARALLEL_STRATEGIES.get(plan.parallelism.strategy)
    timed = plan.stragglers.enabled and strategy.runs_alone_on_rank_0
    own = OwnClock(device or torch.device("cpu")) if timed else None
    watches = RankWatches(own=own, fault=RankFault.from_env(rank))
    if pulse is not None:
        watches.pulse = pulse
    return watches


PEER_SIGNS = (
    "gloo/transport/",
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
)
"""What a peer's loss reads as where torch raises a plain RuntimeError (gloo's errors): any
error of gloo's transport (its source path leads the message) is about a connection to a
peer, whichever way it broke (closed, reset, a read or write error, a recv that timed out
waiting for a peer that hung, a pair closed after one of those)."""


def peer_lost(exc: BaseException) -> bool:
    """Whether a rank failed because another process of the run went away (a collective or
    the rendezvous store lost its peer), rather than for a fault of its own: NCCL's and the
    store's errors are DistErrors, gloo's are RuntimeErrors known by PEER_SIGNS."""
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc)
    return any(sign in text for sign in PEER_SIGNS)

"""Multi-process train runs: the worker launches torchrun, which starts the ranks.

The worker process stays what it is (it holds the run's lease, heartbeats, and hears SIGTERM)
and starts torch.distributed's elastic launcher as a child:

    worker ──spawns──▶ python -I … trainctl.worker.launch launch job.json  (torchrun)
                          └─▶ N × python -I … trainctl.worker.launch rank job.json

Both start isolated (store.processes): they import nothing from the working folder or
PYTHONPATH. torchrun runs as a child rather than in the worker because its agent installs
its own SIGTERM handler, which would kill the ranks instead of letting a train run
checkpoint and requeue. The child dies with the worker (PR_SET_PDEATHSIG), and torchrun
then stops the ranks. Every store and connection of the run listens on one address only,
loopback on one node (worker.rendezvous).

How the ranks share the work is `worker.training.parallel`'s, by the plan's strategy
(`worker.training.parallelism`). Rank 0 alone talks to the run store (events, progress, cancel, the
lease check before a checkpoint commits) and writes checkpoints. Under ddp every rank holds the full
model and optimizer state, identical on all of them, so rank 0's checkpoint is everyone's; under
fsdp the ranks gather the full state onto rank 0 for it (`worker.training.fsdp`). Resume loads the
checkpoint on every rank.

A gang run (nnodes > 1, docs/design/placement.md "Placement and gangs") is the same program on
several workers at once: each starts torchrun with `--nnodes N --node-rank k` and the c10d
rendezvous at the leader's address, id `<run>-<attempt>`. The rendezvous, not the node rank,
decides which process is global rank 0; it reports as its own worker, which the run store
accepts from any member of the attempt. A member whose ranks end without rank 0 leaves the
reporting to the member that has it; one whose ranks lost their peers raises `PeerLost`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

from trainctl.store.checkpoints.factory import open_stores
from trainctl.store.checkpoints.manifests import DCP_LAYOUT
from trainctl.store.checkpoints.protection import ProtectionPolicy
from trainctl.store.db.runs import RunStore
from trainctl.store.exceptions import LeaseLost
from trainctl.store.layout import DRAIN_SECONDS, DataLayout
from trainctl.store.plans import TrainPlan
from trainctl.store.processes import isolated_env, python_command
from trainctl.store.training.parallelism import PARALLEL_STRATEGIES
from trainctl.worker.context import RunContext
from trainctl.worker.drain import Shutdown, as_shutdown
from trainctl.worker.evals.side_runs import CheckpointEvals
from trainctl.worker.rendezvous import LOOPBACK, host_store, rank_store, socket_env
from trainctl.worker.training.loop import Trainer
from trainctl.worker.training.parallel import AgreedStop, RankSampler
from trainctl.worker.training.parallelism import Ranks

if TYPE_CHECKING:
    from trainctl.worker.checkpoints.async_sharded import AsyncShardedCheckpointer

POLL_SECONDS = 0.2
RESULT_FILE, STOP_FILE, ERROR_FILE = "result.json", "stop", "error.json"
DRAIN_FILE = "drain"
"""When the worker's stop began (`time.monotonic()`, shared by the node's processes): the
ranks' drain deadline counts from it, not from when they read the stop file."""
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
RENDEZVOUS_JOIN_SECONDS = 120
"""How long a gang member waits for the others at the rendezvous before giving up."""
STOP_GRACE_SECONDS = 30.0
"""How long the ranks of a worker that lost its lease get to stop at a step before it kills
them (a rank waiting in a collective on a peer that is gone may never reach one)."""


class PeerLost(RuntimeError):
    """A gang's ranks stopped because a member on another node went away."""


# ---- the parent side: the worker launches and watches the ranks -------------------------


def launch_train(
    plan: TrainPlan,
    layout: DataLayout,
    ctx: RunContext | None,
    local_addr: str | None = None,
) -> dict[str, Any] | None:
    """Run `plan` on `plan.nproc_per_node` local ranks (of a gang, when the run is one);
    return rank 0's result, or None on a gang member whose ranks ended without rank 0.

    With a `ctx`, rank 0 reports to the run store as this worker and attempt, and the ranks
    stop at the next step once the worker shuts down or loses the lease. Without one (tests,
    scripts), rank 0 returns the metrics in the result instead. `local_addr` is the address
    the other members reach this node at. The ranks save into the checkpoint store of
    `layout`'s data dir, which each opens itself (`store.checkpoints.factory.open_stores`).
    """
    check_world(plan)
    gang = ctx.run.gang if ctx is not None else None
    with tempfile.TemporaryDirectory(prefix="trainctl-ddp-") as tmp:
        workdir = Path(tmp)
        job_file = workdir / "job.json"
        rendezvous, hosted = rendezvous_of(ctx)
        job: dict[str, Any] = {
            "plan": plan.model_dump(mode="json"),
            # Each rank opens the data dir's stores as the worker did (store.checkpoints.factory).
            "data_dir": str(layout.root),
            "storage_url": layout.storage_url,
            "cache_dir": None if layout.cache_dir is None else str(layout.cache_dir),
            "cache_bytes": layout.cache_bytes,
            "torchrun": torchrun_args(plan, ctx, local_addr, job_file),
            # host:port; hosted: the launcher serves the store there (one node, a gang's leader)
            "rendezvous": {"endpoint": rendezvous, "hosted": hosted},
        }
        if ctx is not None:
            job["run"] = {
                "id": ctx.run.id,
                "worker_id": ctx.worker_id,
                "attempt": ctx.attempt,
                "lease_seconds": ctx.lease_seconds,
                "drain_seconds": getattr(as_shutdown(ctx.shutdown), "seconds", DRAIN_SECONDS),
            }
        job_file.write_text(json.dumps(job))
        command = python_command("trainctl.worker.launch", "launch", str(job_file))
        env = child_env(ctx, local_addr or LOOPBACK, gang=gang is not None)
        with subprocess.Popen(command, env=env) as proc:
            code = watch(proc, workdir, ctx)
        return read_result(workdir, code, gang=gang is not None)


def rendezvous_of(ctx: RunContext | None) -> tuple[str, bool]:
    """Where the c10d rendezvous meets, and whether this node hosts it: one node on a free
    loopback port, a gang at its leader's address (docs/design/training.md, "Multi-GPU and
    multi-node"; worker.rendezvous)."""
    gang = ctx.run.gang if ctx is not None else None
    if gang is None:
        return f"{LOOPBACK}:0", True
    return gang.rendezvous, gang.node_rank == 0


def torchrun_args(
    plan: TrainPlan, ctx: RunContext | None, local_addr: str | None, job_file: Path
) -> list[str]:
    """torchrun's arguments but the rendezvous endpoint (the launcher adds it): one node, or
    this member's place in a gang. No restarts either way: the queue retries a run from its
    checkpoint, on any workers. The ranks start isolated (store.processes), which torchrun's
    own `python -u -m` would not: hence `--no-python` and the whole command."""
    gang = ctx.run.gang if ctx is not None else None
    run_id = f"{ctx.run.id}-{ctx.attempt}" if ctx is not None else uuid.uuid4().hex
    nodes = [f"--nnodes={gang.nnodes}", f"--node-rank={gang.node_rank}"] if gang else []
    args = [
        f"--nproc-per-node={plan.nproc_per_node}",
        "--max-restarts=0",
        *nodes,
        "--rdzv-backend=c10d",
        f"--rdzv-id={run_id}",
        # The launcher hosts the store (worker.rendezvous): torchrun only joins it.
        f"--rdzv-conf=is_host=0,join_timeout={RENDEZVOUS_JOIN_SECONDS}",
        f"--local-addr={local_addr if gang and local_addr else LOOPBACK}",
        "--no-python",
    ]
    rank = python_command("trainctl.worker.launch", "rank", str(job_file), unbuffered=True)
    return [*args, *rank]


def world_size(plan: TrainPlan) -> int:
    return plan.nnodes * plan.nproc_per_node


def check_world(plan: TrainPlan) -> None:
    n = world_size(plan)
    accum = plan.batch.grad_accum_steps
    if accum % n:
        raise ValueError(f"grad_accum_steps {accum} does not split across {n} ranks")
    # Per node: the other nnodes - 1 members bring their own GPUs.
    if plan.device == "cuda" and torch.cuda.device_count() < plan.nproc_per_node:
        raise RuntimeError(
            f"the run asks for nproc_per_node={plan.nproc_per_node} GPUs but this worker sees "
            f"{torch.cuda.device_count()}; start the worker with all of the node's GPUs visible"
        )


def child_env(ctx: RunContext | None, local_addr: str, *, gang: bool) -> dict[str, str]:
    """torchrun's environment, and so the ranks': isolated (store.processes), with no store
    shared by torchrun and the interfaces gloo and NCCL may use (worker.rendezvous)."""
    env = isolated_env(os.environ)
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env.update(socket_env(local_addr, gang, os.environ))
    if ctx is not None:
        # Through the environment, not the job file: the URL may hold a password.
        env["TRAINCTL_DATABASE_URL"] = ctx.runs.engine.url.render_as_string(hide_password=False)
    return env


def watch(proc: subprocess.Popen[bytes], workdir: Path, ctx: RunContext | None) -> int:
    """Wait for the ranks; ask them to stop when the worker shuts down or loses the lease,
    and end them if, having lost it, they have not stopped within STOP_GRACE_SECONDS."""
    stop = workdir / STOP_FILE
    lost_at: float | None = None
    while True:
        try:
            return proc.wait(timeout=POLL_SECONDS)
        except subprocess.TimeoutExpired:
            if ctx is None:
                continue
            reason = "lease_lost" if ctx.lease_lost.is_set() else None
            reason = reason or ("lease_expired" if ctx.lease_expired() else None)
            reason = reason or ("shutdown" if ctx.shutdown.is_set() else None)
            if reason and not stop.exists():
                maybe_write_drain(workdir, ctx)
                stop.write_text(reason)
            if reason in ("lease_lost", "lease_expired"):
                lost_at = lost_at or time.monotonic()
                if time.monotonic() - lost_at > STOP_GRACE_SECONDS:
                    proc.terminate()  # torchrun stops its ranks


def maybe_write_drain(workdir: Path, ctx: RunContext) -> None:
    """Before the stop file: the moment the worker's stop began, for the ranks' deadline."""
    shutdown = as_shutdown(ctx.shutdown)
    if shutdown is not None and shutdown.since is not None:
        (workdir / DRAIN_FILE).write_text(repr(shutdown.since))


def read_result(workdir: Path, code: int, *, gang: bool = False) -> dict[str, Any] | None:
    path = workdir / RESULT_FILE
    if not path.exists():
        error_file = workdir / ERROR_FILE
        error = json.loads(error_file.read_text()) if error_file.exists() else None
        if gang and (error is None or error.get("peer_lost")):
            if code == 0:
                return None  # a member without rank 0: the member with it reports
            detail = f" ({error['message']})" if error else ""
            raise PeerLost(
                f"the gang's processes on this node exited with code {code}: a member on "
                f"another node went away{detail}"
            )
        if error is not None:
            raise RuntimeError(f"{error['type']}: {error['message']}")
        raise RuntimeError(
            f"the distributed run's ranks exited with code {code} before rank 0 reported; "
            "the worker's log holds their output"
        )
    report: dict[str, Any] = json.loads(path.read_text())
    if "error" in report:
        error = report["error"]
        if error["type"] == "LeaseLost":
            raise LeaseLost(error["message"])
        if gang and error.get("peer_lost"):
            raise PeerLost(f"{error['type']}: {error['message']}")
        raise RuntimeError(f"{error['type']}: {error['message']}")
    result: dict[str, Any] = report["result"]
    return result


# ---- torchrun: the launcher child ---------------------------------------------------------


def run_launcher(job_file: str) -> int:
    """torchrun, with the arguments the worker chose (`torchrun_args`), after serving the
    rendezvous store where this node hosts it (worker.rendezvous)."""
    die_with_parent()
    from torch.distributed.run import main as torchrun

    job = json.loads(Path(job_file).read_text())
    endpoint, store = job["rendezvous"]["endpoint"], None
    if job["rendezvous"]["hosted"]:
        try:
            store, endpoint = host_store(endpoint)
        except OSError as exc:  # a fault of this node (its --address), not a peer gone
            error = {"type": "OSError", "message": str(exc), "peer_lost": False}
            (Path(job_file).parent / ERROR_FILE).write_text(json.dumps(error))
            return 1
    try:
        torchrun([f"--rdzv-endpoint={endpoint}", *job["torchrun"]])
    finally:
        del store  # the rendezvous ends with torchrun
    return 0


def die_with_parent() -> None:
    """Get SIGTERM when the worker dies (even by SIGKILL); torchrun then stops the ranks."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the worker died before prctl took effect
        sys.exit(1)


# ---- a rank ----------------------------------------------------------------------------------


class RankTrainer(Trainer):
    """A Trainer of rank `rank` of `world`, built for the plan's strategy (`Ranks`, before the
    optimizers), reading its share of the batches; only rank 0 reports and samples.

    Checkpoints take the strategy's layout (store.training.parallelism `checkpoint_layout`): a full
    one is written by rank 0 alone from whole tensors (a replica's own, or gathered from the
    shards); a sharded one by every rank, its own shards, in parallel (worker.
    sharded_checkpoint), and in the background its copy of them is made while the next step's
    forward and backward run, and waited for only before the optimizers change them."""

    def __init__(self, plan: TrainPlan, *args: Any, rank: int, world: int, **kwargs: Any) -> None:
        self.rank = rank
        super().__init__(plan, *args, ranks=Ranks(world, plan.parallelism), **kwargs)
        self.parts.sampler = RankSampler(self.parts.sampler, rank, world)
        if rank != 0:
            self.samples = None  # rank 0 reports, and samples; the others wait at the next step
        self.sharded_saves: AsyncShardedCheckpointer | None = None
        strategy = PARALLEL_STRATEGIES.get(plan.parallelism.strategy)
        self.sharded = strategy.checkpoint_layout == DCP_LAYOUT
        if self.sharded and plan.async_checkpoint:
            # Built on every rank at once: it makes a process group of its own.
            from trainctl.worker.checkpoints.async_sharded import AsyncShardedCheckpointer

            self.sharded_saves = AsyncShardedCheckpointer(staging="background")
            self.checkpointer, self.before_update = (
                self.sharded_saves,
                self.sharded_saves.wait_staged,
            )

    def save(self, tag: str | None = None) -> None:
        if self.sharded:
            self.save_sharded(tag)
            return
        state = self.capture(tag)  # every rank: a strategy's StateAccess may gather collectively
        if self.rank == 0:
            self.write(state)

    def save_sharded(self, tag: str | None) -> None:
        from trainctl.worker.checkpoints.sharded import capture_sharded, write_sharded

        plan = self.plan
        state = capture_sharded(**self.checkpoint_fields(tag))
        info = self.saved_info(state.tag)
        # `protected` and `before_commit` are asked on rank 0, at its commit (finish_save).
        commit: dict[str, Any] = {
            "max_keep": plan.max_keep,
            "protected": self.protected,
            "before_commit": self.before_commit,
            "after_commit": self.committed(info),
        }
        if self.sharded_saves is not None:
            done = self.sharded_saves.save(state, self.store, info=info, **commit)
        else:
            started = time.perf_counter()
            where = write_sharded(state, self.store, **commit)
            done = [{**info, "save_seconds": time.perf_counter() - started, "path": where}]
        for saved in done:
            self.on_checkpoint(saved)  # rank 0's callback; the others' do nothing


def rank_context(job: dict[str, Any], runs: RunStore) -> RunContext:
    """Rank 0's view of the run: the worker's identity and attempt, so its writes are fenced."""
    info = job["run"]
    # The attempt the worker claimed, not the row's current one: if the run has moved on,
    # the fenced writes must fail.
    run = dataclasses.replace(runs.get(info["id"]), attempt=info["attempt"])
    # Set once the worker asks to stop (see rank_stop), with the worker's deadline.
    shutdown = Shutdown(info.get("drain_seconds", DRAIN_SECONDS))
    return RunContext(run, runs, info["worker_id"], shutdown, info["lease_seconds"])


def rank_stop(ctx: RunContext | None, stop_file: Path) -> Callable[[], str | None]:
    """A rank's own reason to stop: its worker's stop file, and on rank 0 cancel and the
    lease too."""

    def reason() -> str | None:
        asked = (stop_file.read_text() or "shutdown") if stop_file.exists() else None
        if ctx is None:
            return asked
        if asked == "shutdown":
            drain = stop_file.parent / DRAIN_FILE
            since = float(drain.read_text()) if drain.exists() else None
            cast(Shutdown, ctx.shutdown).set(since)
        return ctx.stop_reason() or asked

    return reason


def run_rank(job_file: str) -> int:
    job = json.loads(Path(job_file).read_text())
    workdir = Path(job_file).parent
    plan = TrainPlan.model_validate(job["plan"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
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
    on_metrics: Callable[[dict[str, Any]], None] = ctx.metrics if ctx else metrics.append
    if rank != 0:
        on_metrics = lambda m: None  # noqa: E731
    stop = AgreedStop(rank_stop(ctx, workdir / STOP_FILE), device or torch.device("cpu"))
    cache = job.get("cache_dir")
    layout = DataLayout(
        Path(job["data_dir"]), job.get("storage_url"), cache and Path(cache), job["cache_bytes"]
    )
    stores = open_stores(layout, runs)
    store = stores.checkpoints
    protected = ProtectionPolicy(runs, store).asker(plan.experiment)
    evals = CheckpointEvals(plan, ctx, stores) if ctx else None
    trainer = RankTrainer(
        plan,
        store,
        rank=rank,
        world=world,
        run_id=ctx.run.id if ctx else None,
        on_metrics=on_metrics,
        on_checkpoint=ctx.log_checkpoint if ctx else None,
        on_progress=ctx.progress if ctx else None,
        on_sample=ctx.sample if ctx else None,
        should_stop=stop,
        protected=ctx.while_owned(protected) if ctx else protected,
        before_commit=ctx.confirm_lease if ctx else None,
        after_commit=evals,
        datasets=stores.datasets,
        drain=as_shutdown(ctx.shutdown) if ctx else None,
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


def peer_lost(exc: BaseException) -> bool:
    """Whether a rank failed because another process of the run went away (a collective or
    the rendezvous store lost its peer), rather than for a fault of its own."""
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc)
    return any(
        sign in text
        for sign in ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "launch":
        return run_launcher(args[1])
    if len(args) == 2 and args[0] == "rank":
        return run_rank(args[1])
    print("usage: python -m trainctl.worker.launch (launch | rank) JOB_FILE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

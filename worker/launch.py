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

This module is the worker's side: the job file, torchrun's arguments and environment, watching
the child, reading the result. What a rank does is `worker.training.ranks`'s; how the ranks
share the work and write their checkpoints, the plan's strategy's (`worker.training.parallel`,
`worker.training.parallelism`). Rank 0 alone talks to the run store (events, progress, cancel,
the lease check before a checkpoint commits) and leaves the result.

A gang run (nnodes > 1, docs/design/placement.md "Placement and gangs") is the same program on
several workers at once: each starts torchrun with `--nnodes N --node-rank k` and the c10d
rendezvous at the leader's address, id `<run>-<attempt>`. The rendezvous, not the node rank,
decides which process is global rank 0; it reports as its own worker, which the run store
accepts from any member of the attempt. A member whose ranks end without rank 0 leaves the
reporting to the member that has it; one whose ranks lost their peers raises `PeerLost`.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from trainctl.store.exceptions import LeaseLost
from trainctl.store.kinds.train import TrainPlan
from trainctl.store.processes import isolated_env, python_command
from trainctl.store.worker_settings import WorkerSettings, inherited
from trainctl.worker.context import RunContext
from trainctl.worker.drain import as_shutdown
from trainctl.worker.rendezvous import LOOPBACK, host_store, socket_env
from trainctl.worker.training.hangs import (
    Hang,
    ProgressBoard,
    RanksHung,
    dump_stacks,
    kill_ranks,
    overdue,
)

log = logging.getLogger("trainctl.worker")
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
    settings: WorkerSettings,
    ctx: RunContext | None,
    local_addr: str | None = None,
) -> dict[str, Any] | None:
    """Run `plan` on `plan.nproc_per_node` local ranks (of a gang, when the run is one);
    return rank 0's result, or None on a gang member whose ranks ended without rank 0.

    With a `ctx`, rank 0 reports to the run store as this worker and attempt, and the ranks
    stop at the next step once the worker shuts down or loses the lease. Without one (tests,
    scripts), rank 0 returns the metrics in the result instead. `local_addr` is the address
    the other members reach this node at. The ranks get the worker's `settings`, and with
    them its stores, which each opens itself (`store.checkpoints.factory.open_stores`).
    """
    check_world(plan)
    gang = ctx.run.gang if ctx is not None else None
    with tempfile.TemporaryDirectory(prefix="trainctl-ddp-") as tmp:
        workdir = Path(tmp)
        job_file = workdir / "job.json"
        job = build_job(plan, settings, ctx, local_addr, job_file)
        job_file.write_text(json.dumps(job))
        command = python_command("trainctl.worker.launch", "launch", str(job_file))
        env = child_env(settings, local_addr or LOOPBACK, gang=gang is not None)
        shield = block_step_signals if in_job_step() else None
        board = ProgressBoard.create(workdir, plan.nproc_per_node) if plan.hang.enabled else None
        with subprocess.Popen(command, env=env, preexec_fn=shield) as proc:
            code = watch(proc, workdir, ctx, board)
        return read_result(workdir, code, gang=gang is not None)


def build_job(
    plan: TrainPlan,
    settings: WorkerSettings,
    ctx: RunContext | None,
    local_addr: str | None,
    job_file: Path,
) -> dict[str, Any]:
    """The job file the launcher and the ranks read (`run_launcher`, `run_rank`)."""
    rendezvous, hosted = rendezvous_of(ctx)
    job: dict[str, Any] = {
        "plan": plan.model_dump(mode="json"),
        # The worker's settings but its secrets (child_env): each rank opens the stores as
        # the worker did (store.checkpoints.factory), and reports as it.
        "settings": settings.job_values(),
        "torchrun": torchrun_args(plan, ctx, local_addr, job_file),
        # host:port; hosted: the launcher serves the store there (one node, a gang's leader)
        "rendezvous": {"endpoint": rendezvous, "hosted": hosted},
    }
    if ctx is not None:
        job["run"] = {"id": ctx.run.id, "attempt": ctx.attempt}
    return job


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


def child_env(settings: WorkerSettings, local_addr: str, *, gang: bool) -> dict[str, str]:
    """torchrun's environment, and so the ranks': isolated (store.processes), with no store
    shared by torchrun and the interfaces gloo and NCCL may use (worker.rendezvous), and
    the worker's secret settings (the database URL may hold a password), which the job file
    leaves out; none inherited."""
    env = inherited(isolated_env(os.environ))
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env.update(socket_env(local_addr, gang, os.environ))
    env.update(settings.secrets())
    return env


def watch(
    proc: subprocess.Popen[bytes],
    workdir: Path,
    ctx: RunContext | None,
    board: ProgressBoard | None = None,
) -> int:
    """Wait for the ranks; ask them to stop when the worker shuts down or loses the lease,
    and end them if, having lost it, they have not stopped within STOP_GRACE_SECONDS. A rank
    past its deadline on the progress `board` ends the attempt (`stop_hung`)."""
    stop = workdir / STOP_FILE
    lost_at: float | None = None
    while True:
        try:
            return proc.wait(timeout=POLL_SECONDS)
        except subprocess.TimeoutExpired:
            hang = overdue(board) if board is not None else None
            if hang is not None:
                stop_hung(proc, workdir, ctx, hang)
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
                    proc.send_signal(stop_signal())  # torchrun stops its ranks


def stop_hung(
    proc: subprocess.Popen[bytes], workdir: Path, ctx: RunContext | None, hang: Hang
) -> None:
    """A rank is hung (worker.training.hangs): put every local rank's Python stacks in the
    run's events (and the worker's log), kill the ranks, wait for torchrun, and raise
    `RanksHung`, which requeues the run as a new attempt. The collective's own timeout (the
    NCCL watchdog's 10 minutes) is never waited for."""
    message = f"hang: {hang.describe()}"
    log.warning("%s%s", f"run {ctx.run.id}: " if ctx else "", message)
    for rank, stack in sorted(dump_stacks(hang, workdir).items()):
        text = stack or "(no stack: the rank did not answer)"
        log.warning("rank %d's stacks:\n%s", rank, text)
        if ctx is not None:
            ctx.log(f"hang: rank {rank}'s Python stacks:\n{text}", level="warning")
    if ctx is not None:
        _, step, phase, late = hang.overdue[0]
        data = {
            "ranks": [rank for rank, *_ in hang.overdue],
            "step": step,
            "phase": phase,
            "late_seconds": round(late, 3),
        }
        ctx.log(message, level="error", hang=data)
    kill_ranks(hang)
    try:
        proc.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    raise RanksHung(message)


def in_job_step() -> bool:
    """Whether this process runs in a Slurm job step: Slurm's stop (scancel, preemption, the
    `--signal` before the time limit) sends SIGTERM to every process of the step, torchrun
    and the ranks included, where it would kill them before the worker's drain saves."""
    return "SLURM_STEP_ID" in os.environ


def block_step_signals() -> None:
    """In the launcher child, before exec: SIGTERM blocked, for it and the ranks it starts
    (a blocked signal stays blocked across fork and exec). Only the worker hears the step's
    SIGTERM, and it stops the ranks as it does on any drain: at a step, after the save."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def stop_signal() -> signal.Signals:
    """What ends torchrun (it then stops the ranks): SIGTERM, or SIGINT where SIGTERM is
    blocked (`block_step_signals`); torchrun treats both alike."""
    return signal.SIGINT if in_job_step() else signal.SIGTERM


def maybe_write_drain(workdir: Path, ctx: RunContext) -> None:
    """Before the stop file: the moment the worker's stop began, for the ranks' deadline."""
    shutdown = as_shutdown(ctx.shutdown)
    if shutdown is not None and shutdown.since is not None:
        # Whole or absent (a rank reads it once the ranks agree on a stop, which may be
        # before this node's stop file is written: another rank asked).
        partial = workdir / f"{DRAIN_FILE}.part"
        partial.write_text(repr(shutdown.since))
        os.replace(partial, workdir / DRAIN_FILE)


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
    """Get `stop_signal()` when the worker dies (even by SIGKILL); torchrun then stops the
    ranks."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, stop_signal())
    if os.getppid() != parent:  # the worker died before prctl took effect
        sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "launch":
        return run_launcher(args[1])
    if len(args) == 2 and args[0] == "rank":
        # Here, not at the top: the launcher child (torchrun) imports no trainer.
        from trainctl.worker.training.ranks import run_rank

        return run_rank(args[1])
    print("usage: python -m trainctl.worker.launch (launch | rank) JOB_FILE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

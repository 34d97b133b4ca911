"""A worker inside a Slurm job (docs/design/backends.md, "Slurm"): each task of the job (one
per node) serves the run the job was submitted for, then exits.

Slurm, not the queue, says where the gang is: the node rank is `SLURM_NODEID`, the nodes are
`SLURM_JOB_NODELIST`, and the rendezvous is on the first node's `NodeAddr` (`scontrol show
node`), at a port derived from the job id unless TRAINCTL_RENDEZVOUS_PORT fixes one. The
first task claims the run for the job (`Launches.claim`), giving each other task its place;
the others wait for theirs. Everything after the claim is an ordinary worker's run: events,
checkpoints, fencing, the lease, the drain on SIGTERM.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainctl.store.db.launches import launch_worker_id
from trainctl.store.db.records import Run
from trainctl.worker.launch import RENDEZVOUS_JOIN_SECONDS
from trainctl.worker.runner import Worker

log = logging.getLogger("trainctl.worker")
BACKEND = "slurm"
RUN_FLAG = "--slurm-run"
PORT_BASE, PORT_SPAN = 20000, 20000
"""Where a job's rendezvous port is taken from when none is set: one the job id picks, so
that every task derives the same one without talking to the others."""


@dataclass(frozen=True)
class SlurmTask:
    """This process's place in its job, as Slurm's environment says."""

    job_id: str
    node_rank: int
    nnodes: int
    nodelist: str
    node_name: str

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SlurmTask:
        missing = [
            name
            for name in (
                "SLURM_JOB_ID",
                "SLURM_NODEID",
                "SLURM_JOB_NUM_NODES",
                "SLURM_JOB_NODELIST",
            )
            if not environ.get(name)
        ]
        if missing:
            raise SystemExit(
                f"{RUN_FLAG} runs only as a task of a Slurm job (srun in the job trainctl "
                f"submitted); missing {', '.join(missing)}"
            )
        return cls(
            environ["SLURM_JOB_ID"],
            int(environ["SLURM_NODEID"]),
            int(environ["SLURM_JOB_NUM_NODES"]),
            environ["SLURM_JOB_NODELIST"],
            environ.get("SLURMD_NODENAME") or os.uname().nodename,
        )

    @property
    def members(self) -> list[str]:
        """The worker ids of the job's tasks, by node rank."""
        return [launch_worker_id(BACKEND, self.job_id, k) for k in range(self.nnodes)]

    @property
    def worker_id(self) -> str:
        return self.members[self.node_rank]

    def rendezvous(self, port: int) -> str:
        first = hostnames(self.nodelist)[0]
        return f"{node_address(first)}:{port or PORT_BASE + int(self.job_id) % PORT_SPAN}"


def scontrol(*args: str) -> str:
    return subprocess.run(
        ["scontrol", *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def hostnames(nodelist: str) -> list[str]:
    """A Slurm host list (`n[1-3]`) expanded, in Slurm's order."""
    return scontrol("show", "hostnames", nodelist).split()


def node_address(node: str) -> str:
    """The address other nodes reach `node` at: its NodeAddr, which is its name when the
    cluster gives none."""
    match = re.search(r"\bNodeAddr=(\S+)", scontrol("show", "node", node))
    return match.group(1) if match else node


def split_run_flag(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """The run of `--slurm-run RUN` (or `--slurm-run=RUN`), and the other arguments."""
    rest, run_id, args = [], None, list(argv)
    while args:
        arg = args.pop(0)
        if arg == RUN_FLAG and args:
            run_id = args.pop(0)
        elif arg.startswith(f"{RUN_FLAG}="):
            run_id = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return run_id, rest


def serve_job_run(worker: Worker, run_id: str, task: SlurmTask) -> None:
    """Claim (node rank 0) or join (the others) the run, serve it, and leave."""
    runs, config = worker.runs, worker.config
    worker.register()
    try:
        nodes = ",".join(hostnames(task.nodelist))
        log.info(
            "slurm job %s: node %s (rank %d of %d, nodes %s) serves run %s as %s",
            task.job_id, task.node_name, task.node_rank, task.nnodes, nodes, run_id,
            config.worker_id,
        )  # fmt: skip
        worker.claimed_at = time.monotonic()
        run: Run | None
        if task.node_rank == 0:
            rendezvous = task.rendezvous(config.rendezvous_port)
            run = runs.launches.claim(
                run_id, BACKEND, task.job_id, task.members, rendezvous, config.lease_seconds, nodes
            )
        else:
            run = wait_for_place(worker, task)
        if run is None:
            log.warning(
                "slurm job %s: run %s is not this job's to start (another job has it, or it "
                "is no longer queued); leaving",
                task.job_id, run_id,
            )  # fmt: skip
            return
        worker.run_one(run)
    finally:
        worker.runs.workers.deregister(config.worker_id)


def wait_for_place(worker: Worker, task: SlurmTask) -> Run | None:
    """A gang member's place, once the first task has claimed the run; None if it has not
    within the rendezvous's patience, or the job is stopping."""
    deadline = time.monotonic() + RENDEZVOUS_JOIN_SECONDS
    while time.monotonic() < deadline and not worker.shutdown.is_set():
        worker.claimed_at = time.monotonic()
        run = worker.runs.launches.place(task.worker_id)
        if run is not None:
            return run
        worker.shutdown.wait(worker.config.poll_seconds)
    return None

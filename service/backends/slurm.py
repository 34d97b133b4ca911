"""The Slurm backend (docs/design/backends.md, "Slurm"): every attempt of a run is one
`sbatch`, and `squeue` says what became of it.

One thread, every TRAINCTL_SLURM_POLL_SECONDS:
1. The jobs not known to have ended are read from the run store, then `squeue --json`: a job
   the store lists was submitted before squeue answered, so one squeue does not show has
   ended (finished jobs stay listed for MinJobAge only). An ended job whose run was still
   running in it, or still waiting for it, costs the run an attempt (`Launches.ended`); one
   whose run ended is left alone. `sacct` is never asked: many sites do not offer it.
2. A pending job's reason is kept for `waiting_reason`; a job whose run has ended (a cancel)
   or whose run's cancel was asked is `scancel`ed: the worker's drain sees the cancel.
3. Every queued run without a job that may still start it is submitted.

An `sbatch` that Slurm refuses for the run's own options (a partition that does not exist)
fails the run with Slurm's words; one that cannot reach the controller is tried again.
Commands run as argument lists, never through a shell; the script goes on sbatch's stdin.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from typing import Any

from trainctl.service.settings import Settings
from trainctl.service.supervisor import WORKER_COMMAND, worker_environment
from trainctl.store.backends.slurm import (
    JobState,
    Partition,
    SlurmOptions,
    batch_script,
    chosen_partition,
    elastic_nodes,
    job_name,
    nodes_idle,
    nodes_to_exclude,
    nodes_up,
    parse_node_states,
    parse_partitions,
    parse_squeue,
    sbatch_command,
)
from trainctl.store.db.launches import Launch
from trainctl.store.db.outages import UNAVAILABLE
from trainctl.store.db.records import Run, utcnow
from trainctl.store.db.runs import RunStore
from trainctl.store.vocabulary import TERMINAL_STATES
from trainctl.store.worker_settings import variable

log = logging.getLogger("trainctl.slurm")
BACKEND = "slurm"
COMMAND_SECONDS = 60
TRANSIENT = ("Unable to contact slurm controller", "Socket timed out", "Connection refused",
             "Resource temporarily unavailable", "Slurm temporarily unable")  # fmt: skip
"""sbatch's words for a controller that does not answer now: tried again at the next poll."""
TASK_OWN = ("worker_id", "node_name", "worker_address")
"""Worker settings each task takes from Slurm, never from the service's node."""


class SlurmUnavailable(RuntimeError):
    """A Slurm command failed for a reason of the cluster's, not of the run's."""


class SlurmBackend:
    def __init__(self, settings: Settings, runs: RunStore) -> None:
        self.settings, self.runs = settings, runs
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainctl-slurm", daemon=True)
        self.last_error: str | None = None
        self._growing: set[str] = set()
        """Jobs told to hand their elastic gang back to grow: told once."""

    # ---- the backend protocol ------------------------------------------------------------

    def start(self) -> None:
        self.settings.log_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def stop(self) -> None:
        """The jobs run on without the service: their workers report to the run store, and
        the next service start picks up where this one stopped."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=COMMAND_SECONDS)

    def status(self) -> list[dict[str, object]]:
        open_jobs = self.runs.launches.open(BACKEND)
        return [{"backend": BACKEND, "open_jobs": len(open_jobs), "last_error": self.last_error}]

    # ---- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
                self.last_error = None
            except Exception as exc:  # keep going; the next tick retries
                self.last_error = str(exc)
                if isinstance(exc, (SlurmUnavailable, *UNAVAILABLE)):
                    log.warning("slurm backend: %s; trying again", exc)
                else:
                    log.exception("slurm backend tick failed")
            self._stop.wait(self.settings.slurm_poll_seconds)

    def tick(self) -> None:
        self.watch_jobs()
        for run in self.runs.reap_expired():
            log.warning("reaped run %s (its worker's lease expired): now %s", run.id, run.state)
        for run in self.runs.launches.needing_launch():
            if self._stop.is_set():
                return
            self.submit(run)

    def watch_jobs(self) -> None:
        launches = self.runs.launches.open(BACKEND)  # before squeue: see the module
        if not launches:
            return
        jobs = self.squeue()
        states = {run.id: run for run in self.runs_of(launches)}
        for launch in launches:
            job, run = jobs.get(launch.job_id), states.get(launch.run_id)
            if job is None or job.ended:
                self.ended(launch, job)
                continue
            if (job.state, job.reason, job.nodes) != (launch.state, launch.reason, launch.nodes):
                self.runs.launches.observe(BACKEND, launch.job_id, job.state, job.reason, job.nodes)
            if run is not None and (
                run.cancel_requested or (run.state in TERMINAL_STATES and not launch.claimed_at)
            ):
                self.scancel(launch, run)
            elif run is not None and job.state == "RUNNING":
                self.maybe_grow(launch, run)

    def maybe_grow(self, launch: Launch, run: Run) -> None:
        """An elastic gang whose job runs on fewer nodes than it asks for, once its partition
        has the missing ones idle again: its job's steps get SIGTERM (the drain saves a
        checkpoint at the next step and requeues the run, no attempt used), and its next job
        asks for them all (docs/design/placement.md, "Elastic gangs"). Under the local
        backend its rank 0 asks the run store for idle workers instead (`room_to_grow`)."""
        placement, size = run.placement, run.gang_nnodes
        if placement.min_nnodes is None or size is None or size >= placement.nnodes:
            return
        if launch.job_id in self._growing or not launch.claimed_at or run.state != "running":
            return
        options = SlurmOptions.model_validate((run.launch or {}).get(BACKEND) or {})
        states = self.node_states(options)
        idle = nodes_idle(states) if states is not None else []
        if len(idle) < placement.nnodes - size:
            return
        self.command(["scancel", "--signal=TERM", launch.job_id])
        self._growing.add(launch.job_id)
        message = (
            f"elastic gang: {', '.join(idle)} idle again; slurm job {launch.job_id} hands the "
            f"run back at its next step to grow from {size} to {placement.nnodes} nodes"
        )
        log.info("run %s: %s", run.id, message)
        self.runs.append_event(run.id, "log", {"level": "info", "message": message})

    def runs_of(self, launches: list[Launch]) -> list[Run]:
        return [self.runs.get(run_id) for run_id in dict.fromkeys(j.run_id for j in launches)]

    def ended(self, launch: Launch, job: JobState | None) -> None:
        state = job.state if job is not None else "GONE"
        if job is None:
            reason = "no longer listed by squeue: a node failed, or it was killed unwarned"
        else:
            reason = f"{state}, {job.reason}" if job.reason else state
        moved = self.runs.launches.ended(launch, state, reason)
        if moved is not None:
            log.warning(
                "slurm job %s of run %s ended (%s): the run is now %s, attempt %d",
                launch.job_id, launch.run_id, reason, moved.state, moved.attempt,
            )  # fmt: skip

    def scancel(self, launch: Launch, run: Run) -> None:
        """Stop a job whose run ended or is to be cancelled. Its worker drains on the
        SIGTERM, sees the cancel and ends the run `cancelled`."""
        log.info("run %s is %s: scancel of slurm job %s", run.id, run.state, launch.job_id)
        self.command(["scancel", launch.job_id])

    # ---- submitting ------------------------------------------------------------------------

    def submit(self, run: Run) -> None:
        options = SlurmOptions.model_validate((run.launch or {}).get(BACKEND) or {})
        nnodes = self.elastic_size(run, options)
        if nnodes is None:
            return  # an elastic gang within its grace, its nodes not all up: next tick
        output = str(self.settings.log_dir / f"slurm-{run.id}-%j.out")
        exclude = self.excluded(run, options, nnodes)
        args = sbatch_command(
            run.id, run.attempt, run.placement, options, self.settings.slurm_defaults,
            drain_seconds=self.settings.drain_seconds, output=output, nnodes=nnodes,
            exclude=exclude,
        )  # fmt: skip
        script = batch_script(run.id, WORKER_COMMAND, options)
        try:
            out = self.command(args, stdin=script, env=self.job_environment())
        except SlurmRefused as exc:
            error = f"Slurm refused the job: {exc}"
            if self.runs.launches.refuse(run, error) is not None:
                log.error("run %s: %s", run.id, error)
            return
        job_id = out.strip().split(";")[0]
        self.runs.launches.submitted(run, BACKEND, job_id)
        log.info("run %s attempt %d: submitted as slurm job %s", run.id, run.attempt, job_id)

    def elastic_size(self, run: Run, options: SlurmOptions) -> int | None:
        """The nodes this attempt asks for: an elastic gang's from the nodes of its partition
        that are up now (store.backends.slurm.elastic_nodes); any other run's `nnodes`."""
        placement = run.placement
        if placement.min_nnodes is None:
            return placement.nnodes
        partitions = cluster_partitions(fresh=True)  # a node lost a moment ago is down now
        chosen = chosen_partition(partitions or {}, options, self.settings.slurm_defaults)
        since = run.queued_at or run.created_at
        waited = (utcnow() - since).total_seconds()
        return elastic_nodes(placement, chosen.up if chosen else None, waited)

    def excluded(self, run: Run, options: SlurmOptions, nnodes: int) -> list[str]:
        """The nodes this attempt's job is kept off: the run's stragglers' (docs/design/
        hangs.md, "Stragglers"), where its partition has `nnodes` others up now."""
        avoid = run.placement.avoid_nodes
        if not avoid:
            return []
        states = self.node_states(options)
        return nodes_to_exclude(avoid, nodes_up(states) if states is not None else None, nnodes)

    def node_states(self, options: SlurmOptions) -> dict[str, str] | None:
        """The states of the nodes of the partition a run's jobs go to; None: not known."""
        partitions = cluster_partitions()
        chosen = chosen_partition(partitions or {}, options, self.settings.slurm_defaults)
        return cluster_node_states(chosen.name) if chosen is not None else None

    def job_environment(self) -> dict[str, str]:
        """What the job's tasks start with: the service's environment as a local worker's
        would be, and every worker setting as the service has it, but those each task takes
        from Slurm. sbatch hands it on (its default --export=ALL): the database URL never
        appears in the script."""
        settings = self.settings.worker_settings("").environ()
        for name in TASK_OWN:
            settings.pop(variable(name), None)
        return {**worker_environment(os.environ), **settings}

    # ---- commands --------------------------------------------------------------------------

    def squeue(self) -> dict[str, JobState]:
        out = self.command(["squeue", "--json"])
        try:
            payload: dict[str, Any] = json.loads(out)
        except json.JSONDecodeError as exc:
            raise SlurmUnavailable(f"squeue --json printed no JSON ({exc})") from None
        jobs = parse_squeue(payload)
        return {i: j for i, j in jobs.items() if j.name.startswith(job_name(""))}

    def command(
        self, args: list[str], *, stdin: str | None = None, env: dict[str, str] | None = None
    ) -> str:
        try:
            done = subprocess.run(
                args, input=stdin, capture_output=True, text=True, timeout=COMMAND_SECONDS,
                env=env,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmUnavailable(f"{args[0]}: {exc}") from None
        if done.returncode != 0:
            words = (done.stderr or done.stdout).strip()
            if any(t in words for t in TRANSIENT) or args[0] != "sbatch":
                raise SlurmUnavailable(f"{args[0]} exited with {done.returncode}: {words}")
            raise SlurmRefused(words or f"sbatch exited with {done.returncode}")
        return done.stdout


class SlurmRefused(RuntimeError):
    """sbatch refused the job for what it asks (its options): trying again would not help."""


PARTITIONS_SECONDS = 10.0
"""How long submit trusts what sinfo said of the partitions: a burst of submits asks once."""
_partitions: tuple[float, dict[str, Partition]] | None = None
_partitions_lock = threading.Lock()


def cluster_node_states(partition: str) -> dict[str, str] | None:
    """The state of each node of `partition` (`sinfo -N`, asked afresh: it is asked only for
    a run with nodes to avoid, or an elastic gang that may grow); None when sinfo does not
    answer."""
    try:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-p", partition, "-o", "%N %P %t"], capture_output=True,
            text=True, timeout=COMMAND_SECONDS,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return parse_node_states(done.stdout).get(partition, {})


def cluster_partitions(fresh: bool = False) -> dict[str, Partition] | None:
    """The cluster's partitions and their node counts (`sinfo -s`), for submit's checks
    (store.backends.slurm.check_partition); None when sinfo does not answer: submit then
    queues the run, and sbatch says what it refuses."""
    global _partitions
    with _partitions_lock:
        now = time.monotonic()
        if not fresh and _partitions is not None and now - _partitions[0] < PARTITIONS_SECONDS:
            return _partitions[1]
        try:
            done = subprocess.run(
                ["sinfo", "-h", "-s", "-o", "%P %F"], capture_output=True, text=True,
                timeout=COMMAND_SECONDS,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0:
            return None
        _partitions = (now, parse_partitions(done.stdout))
        return _partitions[1]

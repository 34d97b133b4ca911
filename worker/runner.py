"""The worker process: register, claim runs one at a time, execute, report, repeat.

Started by the service's supervisor (one per GPU) or by hand on another node
(`python -m trainctl.worker`) against the same database and checkpoint storage. SIGTERM stops it
gracefully: a train run checkpoints at the next step boundary and goes back to the queue. A
drain request (POST /workers/{id}/drain), which its heartbeat reads, does the same, and then
the worker exits with DRAINED_EXIT_CODE, which its supervisor does not restart (worker.drain).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path
from types import FrameType

import torch

from trainctl.store.checkpoints.factory import open_stores
from trainctl.store.db.outages import UNAVAILABLE, until_answered
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.exceptions import LeaseLost, WorkerNotFound
from trainctl.store.models.hf_catalog import causal_lm_types, supported_model_types
from trainctl.store.processes import DRAINED_EXIT_CODE
from trainctl.store.training.memory import host_memory_bytes
from trainctl.store.worker_settings import WorkerSettings
from trainctl.worker.context import Heartbeat, RunContext
from trainctl.worker.drain import DeadlineWatch, Shutdown
from trainctl.worker.executor import Outcome, WorkerEnv
from trainctl.worker.kinds.registry import execute
from trainctl.worker.launch import PeerLost
from trainctl.worker.logs import configure_logging, running
from trainctl.worker.models.plugin import MODEL_PLUGINS
from trainctl.worker.rendezvous import listener
from trainctl.worker.training.hangs import RanksHung

log = logging.getLogger("trainctl.worker")
PROG = "python -m trainctl.worker"


def device_info(memory_bytes: int | None = None) -> tuple[str, dict[str, object]]:
    """The device runs get here, and its memory: what submit checks a run's estimate
    against (store.training.memory). On a GPU node, the smallest GPU's, since a rank gets one;
    `memory_bytes`, the worker's budget, where it is lower."""
    device, info = _device_info()
    if memory_bytes is not None:
        info["memory_bytes"] = min(int(str(info["memory_bytes"])), memory_bytes)
    return device, info


def _device_info() -> tuple[str, dict[str, object]]:
    info: dict[str, object] = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        gpus = range(torch.cuda.device_count())
        info["gpus"] = [torch.cuda.get_device_name(i) for i in gpus]
        info["memory_bytes"] = min(torch.cuda.get_device_properties(i).total_memory for i in gpus)
        return "cuda", info
    info["memory_bytes"] = host_memory_bytes()
    return "cpu", info


def hf_model_types() -> list[str]:
    """The causal-LM model types trainctl trains that the transformers installed here
    builds (GET /models lists those of the live workers); none where transformers is
    missing. Read from transformers' own table without importing it: the import costs
    seconds of CPU at every worker start."""
    return sorted(supported_model_types()) if causal_lm_types() is not None else []


def cpu_count() -> int:
    """The cores this process may run on (a container's or cgroup's share, not the host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def free_port(host: str) -> int:
    """A TCP port free at `host` now: the leader's launcher binds the rendezvous store there
    a moment later, at that address alone (worker.rendezvous). Where `host` cannot be bound
    here, a port free on the others: the claim goes on, and the run fails saying why."""
    try:
        sock = listener(host, 0)
    except OSError:
        sock = socket.socket()
        sock.bind(("", 0))
    with sock:
        return int(sock.getsockname()[1])


class Worker:
    def __init__(self, config: WorkerSettings, runs: RunStore | None = None) -> None:
        self.config = config
        self.runs = runs or RunStore(config.db_url)
        device, info = device_info(config.worker_memory_bytes)
        self.device, self.info = device, info
        memory = info["memory_bytes"]
        self.env = WorkerEnv(
            open_stores(config.layout, self.runs),
            config.worker_address,
            memory if isinstance(memory, int) else None,
            settings=config,
        )
        self.shutdown = Shutdown(config.drain_seconds)
        self.drained = False
        """Asked to drain: it exits with DRAINED_EXIT_CODE once its run is handed back."""
        self.abandoned_save = False
        """A drain gave up on a save whose write may still hang (see `main`)."""
        self.claimed_at = time.monotonic()
        """When the last claim began: the lease it gave starts no earlier (RunContext)."""

    def register(self) -> None:
        device, info = self.device, self.info
        self.runs.workers.register(
            self.config.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            device=device,
            info=info,
            node_name=self.config.node,
            gpus=torch.cuda.device_count() if device == "cuda" else 0,
            cpus=cpu_count(),
            address=self.config.worker_address,
            model_plugins=MODEL_PLUGINS.names(),
            hf_model_types=hf_model_types(),
        )

    def rendezvous(self) -> str:
        """host:port for a gang this worker leads."""
        host = self.config.worker_address or socket.getfqdn()
        return f"{host}:{self.config.rendezvous_port or free_port(host)}"

    def install_signal_handlers(self) -> None:
        def stop(signum: int, frame: FrameType | None) -> None:
            log.info(
                "signal %d: saving at the next step and handing the run back within %g s",
                signum,
                self.shutdown.seconds,
            )
            self.shutdown.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)

    def serve_forever(self) -> None:
        self.runs.create_all()
        self.register()
        self.config.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        log.info("worker %s ready (%s)", self.config.worker_id, self.redacted_url())
        next_beat = time.monotonic() + self.config.heartbeat_seconds
        outage = False
        while not self.shutdown.is_set():
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.config.heartbeat_seconds
                    self.beat()
                    self.reap()
                run = None if self.shutdown.is_set() else self.claim()
            except UNAVAILABLE as exc:  # an outage: wait it out, then serve again
                if not outage:
                    worker = self.config.worker_id
                    log.warning("worker %s: the run database does not answer (%s)", worker, exc)
                outage, run = True, None
            else:
                if outage:
                    log.warning("worker %s: the run database answers again", self.config.worker_id)
                outage = False
            if run is not None:
                self.run_one(run)
                continue
            if self.shutdown.wait(self.config.poll_seconds):
                break
        self.drained = self.drained or self.drain_requested()
        self.runs.workers.deregister(self.config.worker_id)
        log.info("worker %s %s", self.config.worker_id, "drained" if self.drained else "stopped")

    def claim(self) -> Run | None:
        self.claimed_at = time.monotonic()
        return self.runs.claim(
            self.config.worker_id,
            self.config.lease_seconds,
            rendezvous=self.rendezvous,
            reserve_after=self.config.gang_reserve_seconds,
        )

    def beat(self) -> None:
        try:
            if self.runs.workers.heartbeat(self.config.worker_id):
                self.drained = True
                self.shutdown.set()
        except WorkerNotFound:
            self.register()  # declared dead while idle (e.g. a long GC pause): come back

    def drain_requested(self) -> bool:
        """Whether it was asked to drain (a busy worker's heartbeat thread heard it first)."""
        try:
            return self.runs.workers.heartbeat(self.config.worker_id)
        except WorkerNotFound:
            return False

    def reap(self) -> None:
        """Requeue the runs of workers that stopped heartbeating (on any host).

        The service's supervisor reaps too, but workers on other nodes must not depend on it:
        with several hosts, any live worker hands a dead one's run back to the queue, and
        the fenced updates in the store make concurrent reapers harmless.
        """
        for run in self.runs.reap_expired():
            log.warning("reaped run %s (its worker's lease expired): now %s", run.id, run.state)

    def redacted_url(self) -> str:
        return self.runs.engine.url.render_as_string(hide_password=True)

    def run_one(self, run: Run) -> None:
        with running(run.id):
            try:
                self._run_one(run)
            finally:
                # Idle again: a gang may take this worker (it claims for itself anyway).
                release = lambda: self.runs.workers.release(self.config.worker_id)  # noqa: E731
                until_answered(release, f"worker {self.config.worker_id}", log)

    def _run_one(self, run: Run) -> None:
        config = self.config
        ctx = RunContext(
            run, self.runs, config.worker_id, self.shutdown, config.lease_seconds, self.claimed_at
        )
        with ctx:  # its reporter thread: training never waits on the database
            ctx.log(f"started on worker {config.worker_id} (attempt {run.attempt})")
            try:
                with (
                    Heartbeat(ctx, config.heartbeat_seconds, config.lease_seconds),
                    DeadlineWatch(self.shutdown, lambda: self.hand_back_late(ctx)),
                ):
                    outcome = execute(ctx, self.env)
            except (PeerLost, RanksHung) as exc:  # a new attempt, on any workers
                self.give_up(ctx, exc)
                return
            except Exception as exc:
                if isinstance(exc, LeaseLost) or ctx.lease_gone():
                    # Not a failure of the run: it belongs to another attempt now (or will,
                    # once the reaper sees the lease ran out), which reports it. (What broke
                    # here may be that attempt's doing: it sweeps the save this worker left
                    # half-written when it stalled.)
                    log.warning("run %s: %s; leaving it to its new owner", run.id, exc)
                    return
                if isinstance(exc, UNAVAILABLE):
                    self.retry(ctx, exc)
                    return
                self.fail(ctx, exc)
                return
            self.report(ctx, outcome)

    def hand_back_late(self, ctx: RunContext) -> None:
        """The drain's deadline passed with the run still going (DeadlineWatch): requeue it,
        as its own stop would have, and end the process, which nothing else may hold up.
        What the run goes on doing until then is fenced out: it is no longer its attempt's."""
        reason = f"the worker stopped; the run did not stop within {self.shutdown.seconds:g} s"
        try:
            self.runs.requeue(ctx.run.id, self.config.worker_id, ctx.attempt, reason)
        except LeaseLost:
            return  # it handed back (or was reaped) meanwhile: the worker ends as usual
        log.warning("run %s: %s; handed back", ctx.run.id, reason)
        self.drained = self.drained or self.drain_requested()
        self.runs.workers.deregister(self.config.worker_id)
        logging.shutdown()
        os._exit(DRAINED_EXIT_CODE if self.drained else 0)

    def give_up(self, ctx: RunContext, exc: PeerLost | RanksHung) -> None:
        """A gang member went away, or a rank hung: requeue the run as a new attempt, on any
        N workers.

        After a pause of one heartbeat, so that a member whose own processes failed (a fault
        of the run, not of a node) records that failure first and the run is not retried in
        vain; whoever of the members comes second is fenced out.
        """
        log.warning("run %s: %s", ctx.run.id, exc)
        ctx.reporter.flush()  # its events (a hang's stacks) before the attempt ends
        time.sleep(self.config.heartbeat_seconds)
        try:
            run = self.runs.give_up(ctx.run.id, self.config.worker_id, ctx.attempt, str(exc))
            log.warning("run %s: attempt given up; the run is now %s", run.id, run.state)
        except LeaseLost:
            log.info("run %s: another member or a reaper already ended this attempt", ctx.run.id)

    def retry(self, ctx: RunContext, exc: Exception) -> None:
        """The run broke on the database's absence, not on a fault of its own: a new attempt
        while attempts remain (as if its worker had died), else failed. An attempt is spent
        all the same, so that a database error that never passes cannot loop the run."""
        log.warning("run %s: the run database did not answer", ctx.run.id, exc_info=exc)
        ctx.reporter.flush()
        reason = f"the run database did not answer ({type(exc).__name__})"
        give_up = lambda: self.runs.give_up(  # noqa: E731
            ctx.run.id, self.config.worker_id, ctx.attempt, reason
        )
        try:
            until_answered(give_up, f"run {ctx.run.id}: giving it back", log)
        except LeaseLost:
            log.info("run %s: a reaper already ended this attempt", ctx.run.id)

    def fail(self, ctx: RunContext, exc: Exception) -> None:
        log.error("run %s failed: %s", ctx.run.id, exc, exc_info=exc)
        error = public_error(exc, self.config)
        ctx.log(f"failed: {type(exc).__name__}: {error}", level="error")
        ctx.reporter.flush()
        finish = lambda: self.runs.finish(  # noqa: E731
            ctx.run.id, self.config.worker_id, ctx.attempt, "failed", error=error
        )
        try:
            until_answered(finish, f"run {ctx.run.id}: recording its failure", log)
        except LeaseLost:
            log.warning("run %s failed after its lease was lost; not recorded", ctx.run.id)

    def report(self, ctx: RunContext, outcome: Outcome) -> None:
        """Record the outcome, waiting out a database outage however long it lasts: a run
        that succeeded meanwhile keeps its success (store.db.runs `finish`)."""
        run_id, wid, attempt = ctx.run.id, self.config.worker_id, ctx.attempt
        if outcome.result and (outcome.result.get("drain") or {}).get("abandoned"):
            self.abandoned_save = True
        what = f"run {run_id}: recording that it is {outcome.state}"
        if outcome.state in ("requeue", "succeeded", "cancelled"):
            ctx.reporter.flush()  # its events before its end
        try:
            if outcome.state == "requeue":
                requeue = lambda: self.runs.requeue(run_id, wid, attempt, outcome.reason)  # noqa: E731
                until_answered(requeue, what, log)
            elif outcome.state in ("succeeded", "cancelled"):
                finish = lambda: self.runs.finish(  # noqa: E731
                    run_id, wid, attempt, outcome.state, result=outcome.result
                )
                until_answered(finish, what, log)
            elif outcome.state == "member":
                log.info("run %s: this member's part ended; %s", run_id, outcome.reason)
            else:
                log.warning("run %s: %s; leaving it to its new owner", run_id, outcome.reason)
        except LeaseLost:
            log.warning("run %s ended after its lease was lost; not recorded", run_id)


# CSI and other escape sequences: colour codes from a library's message mean nothing in the
# API's JSON or the dashboard.
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")


def public_error(exc: BaseException, config: WorkerSettings) -> str:
    """A run's error as its users read it: the message without terminal escape codes, and
    with this node's own folders named rather than spelled out (the full text stays in the
    worker's log)."""
    text = _ESCAPES.sub("", str(exc) or type(exc).__name__)
    text = "".join(c for c in text if c.isprintable() or c in "\n\t")
    folders = {
        "<checkpoints>": config.checkpoint_dir,
        "<data>": config.data_dir,
        "<python>": Path(sys.prefix),
        "~": Path.home(),
    }
    # Longest first: the checkpoint folder lies inside the data folder.
    for label, folder in sorted(folders.items(), key=lambda item: -len(str(item[1]))):
        if len(str(folder)) > 1:
            for spelled in dict.fromkeys([str(folder.resolve()), str(folder)]):
                text = _whole_path(spelled).sub(label, text)
    return text


def _whole_path(folder: str) -> re.Pattern[str]:
    """`folder` where it is a whole path, or the start of one: not inside a longer name
    (HOME=/root must not rewrite /roots/data as ~s/data, nor /srv/root as /srv~)."""
    name = r"[\w.~-]"
    return re.compile(rf"(?<!{name})(?<!/){re.escape(folder)}(?!{name})")


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    # Here, not at the top: worker.backends.slurm builds on this module.
    from trainctl.worker.backends.slurm import (
        SlurmTask,
        node_address,
        serve_job_run,
        split_run_flag,
    )

    job_run, argv = split_run_flag(sys.argv[1:] if argv is None else argv)
    config = WorkerSettings.from_args(argv, prog=PROG, description=__doc__)
    task = SlurmTask.from_environ(os.environ) if job_run is not None else None
    if task is not None:
        # Slurm names this task's node and its address; the worker is the job's, on it.
        where = {"node_name": task.node_name, "worker_address": node_address(task.node_name)}
        config = config.model_copy(update={"worker_id": task.worker_id, **where})
    if config.worker_nice:
        # Before torch starts its threads, which inherit it: training takes what CPU is left
        # while the API (at the service's niceness) answers at once.
        os.nice(config.worker_nice)
    worker = Worker(config)
    worker.install_signal_handlers()
    try:
        if job_run is not None and task is not None:
            serve_job_run(worker, job_run, task)
        else:
            worker.serve_forever()
    finally:
        worker.runs.close()
    code = DRAINED_EXIT_CODE if worker.drained else 0
    if worker.abandoned_save:
        # The abandoned write may hang in an upload to a store that stopped answering, on a
        # pool thread the interpreter would join at exit; it can never commit (worker.
        # async_checkpoint), so it must not hold the node's exit either.
        logging.shutdown()
        os._exit(code)
    return code

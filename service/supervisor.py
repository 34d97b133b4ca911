"""Starts and watches the local worker processes, and reaps expired leases
(docs/design/runs.md, "Runs", "Reaping").

A worker that lived past `worker_healthy_seconds` is restarted at once. One that crashed
sooner (a bad environment, a broken install) is restarted after a backoff that doubles with
each quick crash in a row, and after `worker_max_quick_crashes` of them its slot is given up:
restarting it again would only fail again, so the supervisor stops, logs one ERROR with the
exit codes and the end of the worker's log, and `status()` says why.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainctl.service.devices import gpu_count
from trainctl.service.settings import Settings
from trainctl.store.db.runs import RunStore
from trainctl.store.processes import DRAINED_EXIT_CODE, isolated_env, python_command
from trainctl.store.worker_settings import inherited

if TYPE_CHECKING:
    from trainctl.service.metrics import ServiceMetrics

log = logging.getLogger("trainctl.supervisor")
# Isolated (store/processes.py): a worker imports neither from the service's working folder
# nor from its PYTHONPATH, only what is installed, plug-ins included.
WORKER_COMMAND = tuple(python_command("trainctl.worker"))
STOP_MARGIN_SECONDS = 30.0
"""Beyond the drain's deadline, how long a stopping worker may take to exit (its run is
handed back by then: a worker's DeadlineWatch sees to it)."""
LOG_TAIL_LINES = 10
LOG_TAIL_BYTES = 16384  # enough for LOG_TAIL_LINES lines of JSON log records


@dataclass
class WorkerSlot:
    index: int
    gpus: tuple[int, ...]
    """The GPUs the worker sees (CUDA_VISIBLE_DEVICES); none: a CPU worker."""
    process: subprocess.Popen[bytes] | None = None
    worker_id: str = ""
    restarts: int = 0
    """Times a worker was started again in this slot after one exited."""
    started_at: float = 0.0
    log_path: Path | None = None
    next_start: float = field(default=0.0)
    quick_exit_codes: list[int] = field(default_factory=list)
    """Exit codes of the crashes in a row that came within `worker_healthy_seconds` of a
    start; emptied when a worker lives longer."""
    given_up: str | None = None
    """Why the slot is no longer restarted; None while it is."""
    drained: bool = False
    """Its worker was drained on purpose (it exited with DRAINED_EXIT_CODE): not restarted."""
    oom_kills_at_start: int = 0
    """The cgroup's OOM-kill count when the worker started: more at its SIGKILL means the
    kernel ended it for memory, not an operator's kill -9."""


def default_worker_count(settings: Settings) -> tuple[int, int]:
    """(workers, gpus): one worker per `gpus_per_worker` GPUs, one on a CPU-only node,
    unless configured."""
    gpus = gpu_count()
    if settings.backend != "local":
        return 0, gpus  # workers start inside the scheduler's jobs (service.backends)
    if settings.workers is not None:
        return settings.workers, gpus
    return max(gpus // settings.gpus_per_worker, 1), gpus


def gpu_groups(workers: int, gpus: int, per_worker: int) -> list[tuple[int, ...]]:
    """The GPUs each local worker sees: consecutive groups of `per_worker`. A worker beyond
    the node's GPUs gets none and runs on the CPU rather than share another's GPUs."""
    return [
        tuple(range(i * per_worker, (i + 1) * per_worker)) if (i + 1) * per_worker <= gpus else ()
        for i in range(workers)
    ]


def restart_delay(quick_crashes: int, base: float, cap: float) -> float:
    """Seconds to wait before a restart after `quick_crashes` quick crashes in a row: none
    after a worker that lived (0), then base, 2 base, 4 base, ... up to cap."""
    if quick_crashes <= 0:
        return 0.0
    return min(base * 2.0 ** min(quick_crashes - 1, 64), cap)


def read_log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last `lines` lines of a worker's log, or a line saying why there are none: the
    report they go into must be written whatever state the file is in."""
    if path is None:
        return ["(no log file)"]
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            tail = f.read().decode(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        return [f"(cannot read it: {exc})"]
    return tail or ["(empty)"]


# The service's own secrets and settings, which a worker neither reads nor should hold: the
# API token (a worker talks to the database, never to the API), and the settings of the
# service process itself. A worker gets what it needs explicitly (see `_spawn`).
# Secrets and settings of the service alone: the tracking server's URI may carry a password,
# and the service, not the worker, mirrors metrics to it.
SERVICE_ONLY = (
    "TRAINCTL_API_TOKEN",
    "TRAINCTL_HOST",
    "TRAINCTL_PORT",
    "TRAINCTL_ALLOWED_HOSTS",
    "TRAINCTL_MLFLOW_URI",
)


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a local worker starts with: the service's, less what only it needs,
    less the variables that steer a Python interpreter (`PYTHONPATH`, ...), and less the
    worker settings, which it gets from the service's (`_spawn`)."""
    return {k: v for k, v in inherited(isolated_env(environ)).items() if k not in SERVICE_ONLY}


# The kernel counts the processes its OOM killer ended in the node's (or container's) cgroup.
OOM_EVENTS_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def oom_kills() -> int:
    """How many processes the OOM killer has ended in this cgroup; 0 where it cannot say."""
    for events in OOM_EVENTS_FILES:
        try:
            lines = Path(events).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return 0


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        runs: RunStore,
        *,
        command: Sequence[str] = WORKER_COMMAND,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        """`command` starts one worker (tests give a stand-in); `metrics` counts restarts."""
        self.settings, self.runs = settings, runs
        self.command, self.metrics = list(command), metrics
        count, gpus = default_worker_count(settings)
        groups = gpu_groups(count, gpus, settings.gpus_per_worker)
        self.slots = [WorkerSlot(i, group) for i, group in enumerate(groups)]
        self.node_has_gpus = gpus > 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="trainctl-supervisor", daemon=True)

    def start(self) -> None:
        self.settings.log_dir.mkdir(parents=True, exist_ok=True)
        for slot in self.slots:
            self._spawn(slot)
        self._thread.start()

    def _spawn(self, slot: WorkerSlot) -> None:
        slot.worker_id = f"{socket.gethostname()}-w{slot.index}-{uuid.uuid4().hex[:8]}"
        slot.oom_kills_at_start = oom_kills()
        # Every worker setting as the service has it, whatever its settings came from (the
        # environment, or arguments): none reaches a worker by inheritance alone.
        settings = self.settings.worker_settings(slot.worker_id)
        env = {**worker_environment(os.environ), **settings.environ()}
        if slot.gpus or self.node_has_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, slot.gpus))
        slot.log_path = self.settings.log_dir / f"worker-{slot.index}.log"
        with open(slot.log_path, "ab") as out:
            slot.process = subprocess.Popen(
                self.command, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        slot.started_at = time.monotonic()
        log.info("started worker %s (pid %d)", slot.worker_id, slot.process.pid)

    def _watch(self) -> None:
        """Restart dead workers and reap expired leases until stopped."""
        while not self._stop.wait(self.settings.reap_seconds / 2):
            try:
                for slot in self.slots:
                    self._check(slot)
                for run in self.runs.reap_expired():
                    log.warning("reaped run %s: now %s", run.id, run.state)
            except Exception:  # keep supervising; the next tick retries
                log.exception("supervisor tick failed")

    def _check(self, slot: WorkerSlot) -> None:
        if self._stop.is_set() or slot.given_up or slot.drained:
            return
        if slot.process is None:
            if time.monotonic() >= slot.next_start:
                self._restart(slot)
            return
        code = slot.process.poll()
        if code is None:
            return
        lived = time.monotonic() - slot.started_at
        if code == DRAINED_EXIT_CODE:
            self._drained(slot)
            return
        out_of_memory = code == -signal.SIGKILL and oom_kills() > slot.oom_kills_at_start
        if out_of_memory:
            reason = (
                f"out of memory: the kernel's OOM killer ended worker process {slot.worker_id} "
                f"(exit code {code}); the run needs more memory than this node has"
            )
        else:
            reason = f"worker process {slot.worker_id} exited with code {code}"
        # Out of memory, the next attempt on this node would only be killed again.
        for run in self.runs.fail_worker_runs(slot.worker_id, reason, retry=not out_of_memory):
            log.warning("%s; run %s is now %s", reason, run.id, run.state)
        self.runs.workers.deregister(slot.worker_id)
        slot.process = None
        self._schedule_restart(slot, code, lived)

    def _drained(self, slot: WorkerSlot) -> None:
        """A drained worker handed its run back and exits: an operator's choice, so its slot
        stays empty until the service restarts. What it left running (a run it could not
        hand back) is recovered as for any worker that is gone."""
        reason = f"worker process {slot.worker_id} was drained"
        for run in self.runs.fail_worker_runs(slot.worker_id, reason):
            log.warning("%s; run %s is now %s", reason, run.id, run.state)
        self.runs.workers.deregister(slot.worker_id)
        slot.process, slot.drained = None, True
        log.info("worker %s (slot %d) drained; not restarted", slot.worker_id, slot.index)

    def _schedule_restart(self, slot: WorkerSlot, code: int, lived: float) -> None:
        """After a crash: restart at once, after a backoff, or never (`_give_up`)."""
        settings = self.settings
        if lived >= settings.worker_healthy_seconds:
            slot.quick_exit_codes = []  # it worked for a while: the next crash starts afresh
        else:
            slot.quick_exit_codes.append(code)
            if len(slot.quick_exit_codes) >= settings.worker_max_quick_crashes:
                self._give_up(slot)
                return
        delay = restart_delay(
            len(slot.quick_exit_codes),
            settings.worker_restart_delay_seconds,
            settings.worker_restart_delay_max_seconds,
        )
        slot.next_start = time.monotonic() + delay
        log.warning(
            "worker %s (slot %d) exited with code %d after %.1f s; restarting it in %.1f s",
            slot.worker_id,
            slot.index,
            code,
            lived,
            delay,
        )

    def _restart(self, slot: WorkerSlot) -> None:
        self._spawn(slot)
        slot.restarts += 1
        if self.metrics is not None:
            self.metrics.worker_restarts.labels(str(slot.index)).inc()

    def _give_up(self, slot: WorkerSlot) -> None:
        codes = ", ".join(map(str, slot.quick_exit_codes))
        slot.given_up = (
            f"{len(slot.quick_exit_codes)} crashes in a row, each within "
            f"{self.settings.worker_healthy_seconds:g} s of its start (exit codes {codes})"
        )
        tail = "\n".join(f"    {line}" for line in read_log_tail(slot.log_path))
        # One record, so that the reason and the evidence arrive together.
        log.error(
            "gave up on worker slot %d: %s; it is not restarted until the service restarts. "
            "Last worker %s; the last lines of %s:\n%s",
            slot.index,
            slot.given_up,
            slot.worker_id,
            slot.log_path,
            tail,
        )
        if self.metrics is not None:
            self.metrics.worker_slots_given_up.inc()

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM every worker (a train run checkpoints and is requeued), then wait: by
        default the drain's deadline and a margin for the worker's own exit."""
        timeout = self.settings.drain_seconds + STOP_MARGIN_SECONDS if timeout is None else timeout
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        procs = [s.process for s in self.slots if s.process and s.process.poll() is None]
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker pid %d did not stop in %.0f s; killing it", proc.pid, timeout)
                proc.kill()
                proc.wait()
        for slot in self.slots:
            if slot.worker_id:
                self.runs.fail_worker_runs(slot.worker_id, "service stopped")

    def status(self) -> list[dict[str, object]]:
        return [
            {
                "slot": s.index,
                "worker_id": s.worker_id,
                "gpus": list(s.gpus),
                "restarts": s.restarts,
                "pid": s.process.pid if s.process else None,
                "alive": bool(s.process and s.process.poll() is None),
                "quick_crashes": len(s.quick_exit_codes),
                "given_up": s.given_up is not None,
                "given_up_reason": s.given_up,
                "drained": s.drained,
            }
            for s in self.slots
        ]

    def kill_worker(self, index: int) -> None:
        """For tests and operators: SIGKILL one worker (the supervisor restarts it, after a
        backoff if it had not lived `worker_healthy_seconds`)."""
        proc = self.slots[index].process
        if proc is not None:
            proc.kill()

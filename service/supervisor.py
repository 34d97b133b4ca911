"""Starts and watches the local worker processes, and reaps expired leases.

A worker that dies is restarted (with a short backoff so a crash loop does not spin), and the
run it held is handed back through the run store at once: requeued while attempts remain,
else failed with the exit code as the reason. Nothing stays `running` for a dead process.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from service.devices import gpu_count
from service.settings import Settings
from store.runs import RunStore

log = logging.getLogger("trainctl.supervisor")
RESTART_BACKOFF_MAX = 30.0


@dataclass
class WorkerSlot:
    index: int
    gpus: tuple[int, ...]
    """The GPUs the worker sees (CUDA_VISIBLE_DEVICES); none: a CPU worker."""
    process: subprocess.Popen[bytes] | None = None
    worker_id: str = ""
    restarts: int = 0
    started_at: float = 0.0
    log_path: Path | None = None
    next_start: float = field(default=0.0)


def default_worker_count(settings: Settings) -> tuple[int, int]:
    """(workers, gpus): one worker per `gpus_per_worker` GPUs, one on a CPU-only node,
    unless configured."""
    gpus = gpu_count()
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


class Supervisor:
    def __init__(self, settings: Settings, runs: RunStore) -> None:
        self.settings, self.runs = settings, runs
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
        env = {
            **os.environ,
            "TRAINCTL_DATABASE_URL": self.settings.db_url,
            "TRAINCTL_DATA_DIR": str(self.settings.data_dir.resolve()),
            "TRAINCTL_WORKER_ID": slot.worker_id,
            "TRAINCTL_LEASE_SECONDS": str(self.settings.lease_seconds),
            "TRAINCTL_HEARTBEAT_SECONDS": str(self.settings.heartbeat_seconds),
            "TRAINCTL_WORKER_NICE": str(self.settings.worker_nice),
        }
        if slot.gpus or self.node_has_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, slot.gpus))
        slot.log_path = self.settings.log_dir / f"worker-{slot.index}.log"
        with open(slot.log_path, "ab") as out:
            slot.process = subprocess.Popen(
                [sys.executable, "-m", "worker"], env=env, stdout=out, stderr=subprocess.STDOUT
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
        proc = slot.process
        if proc is None or self._stop.is_set():
            if proc is None and time.monotonic() >= slot.next_start and not self._stop.is_set():
                self._spawn(slot)
            return
        code = proc.poll()
        if code is None:
            return
        reason = f"worker process {slot.worker_id} exited with code {code}"
        for run in self.runs.fail_worker_runs(slot.worker_id, reason):
            log.warning("%s; run %s is now %s", reason, run.id, run.state)
        self.runs.deregister_worker(slot.worker_id)
        slot.restarts += 1
        # A worker that lived a while restarts at once; one that keeps crashing backs off.
        lived = time.monotonic() - slot.started_at
        delay = 0.0 if lived > 60 else min(2.0 ** min(slot.restarts, 5), RESTART_BACKOFF_MAX)
        slot.process, slot.next_start = None, time.monotonic() + delay

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM every worker (a train run checkpoints and is requeued), then wait."""
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
            }
            for s in self.slots
        ]

    def kill_worker(self, index: int) -> None:
        """For tests and operators: SIGKILL one worker (the supervisor restarts it)."""
        proc = self.slots[index].process
        if proc is not None:
            proc.kill()

"""What accelerators this node has, found without importing torch (service/ never does), and
what the live workers can take: whether runs can get CUDA, and how much memory
(docs/design/kinds.md, "Requests and plans"; docs/design/access.md, "Admission and access").
"""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime, timedelta

from trainctl.store.db.workers import Worker, WorkerStore
from trainctl.store.training.memory import MemoryLimit, host_memory_bytes


def gpu_count() -> int:
    """NVIDIA GPUs visible here, by `nvidia-smi -L`; 0 when there is no driver."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def is_live(worker: Worker, lease_seconds: float) -> bool:
    """Seen within the lease period."""
    return datetime.now(UTC) - worker.last_seen_at <= timedelta(seconds=lease_seconds)


def live_workers(workers: WorkerStore, lease_seconds: float) -> list[Worker]:
    return [w for w in workers.list_workers() if is_live(w, lease_seconds)]


def memory_limit(
    workers: WorkerStore, lease_seconds: float, device: str, most_gpu: int
) -> int | MemoryLimit:
    """The most memory a run on `device` can get: the largest that a live worker of that
    device reports (per GPU on a GPU node); before any has, this node's own, since the
    service starts its local workers here; for CUDA with neither, `most_gpu`
    (TRAINCTL_MAX_GPU_MEMORY_BYTES), the largest GPU any worker that joins could have. So a
    run no GPU could hold is refused even while no GPU worker is live, instead of queued
    for one that will never come."""
    reported = [
        w.info["memory_bytes"]
        for w in live_workers(workers, lease_seconds)
        if w.device == device and _is_size(w.info.get("memory_bytes"))
    ]
    if reported:
        return max(reported)
    if device == "cpu":
        return host_memory_bytes()
    return gpu_memory_bytes() or MemoryLimit(
        most_gpu, "any GPU has (TRAINCTL_MAX_GPU_MEMORY_BYTES; no GPU worker is live to say)"
    )


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def gpu_memory_bytes() -> int | None:
    """The smallest GPU's memory here, by `nvidia-smi`; None without a driver."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    query = [exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    sizes = [int(line) for line in out.stdout.split() if line.strip().isdigit()]
    return min(sizes) * (1 << 20) if sizes else None  # MiB


def cuda_available(workers: WorkerStore, lease_seconds: float) -> bool:
    """Whether runs can get a CUDA device: a live worker says so, or this node has a GPU.

    Workers report their device when they register; before any has, the node's own GPUs
    decide (the service starts its local workers on this node).
    """
    alive = live_workers(workers, lease_seconds)
    if alive:
        return any(w.device == "cuda" for w in alive)
    return gpu_count() > 0

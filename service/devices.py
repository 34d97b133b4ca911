"""What accelerators this node has, found without importing torch (service/ never does)."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime, timedelta

from trainctl.store.runs import RunStore


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


def cuda_available(runs: RunStore, lease_seconds: float) -> bool:
    """Whether runs can get a CUDA device: a live worker says so, or this node has a GPU.

    Workers report their device when they register; before any has, the node's own GPUs
    decide (the service starts its local workers on this node).
    """
    cutoff = datetime.now(UTC) - timedelta(seconds=lease_seconds)
    alive = [w for w in runs.list_workers() if w.last_seen_at >= cutoff]
    if alive:
        return any(w.device == "cuda" for w in alive)
    return gpu_count() > 0

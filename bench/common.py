"""What every measurement shares: figures, alternated timing, the real service on a port."""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Figure:
    """One measured number, and the ratio that the issue sets a target for (if any)."""

    name: str
    value: float
    unit: str
    target: float | None = None
    """What the value must reach; None: reported only."""
    note: str = ""
    lower_is_better: bool = False

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.value <= self.target if self.lower_is_better else self.value >= self.target

    def line(self) -> str:
        verdict = {None: "", True: "  [target met]", False: "  [target NOT met]"}[self.met]
        op = "<=" if self.lower_is_better else ">="
        target = f" (target {op} {self.target:g})" if self.target is not None else ""
        note = f"  -- {self.note}" if self.note else ""
        return f"{self.name:<58} {self.value:>12,.3f} {self.unit:<10}{target}{verdict}{note}"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def paired_ratio(numerators: list[float], denominators: list[float]) -> float:
    """Median of the per-round ratios: each round ran both sides back to back, so a burst of
    load from the machine's other tenants hits one pair, not one side."""
    return median([a / b for a, b in zip(numerators, denominators, strict=True) if b > 0])


def step_time_figures(
    prefix: str, times: dict[str, list[float]], side: str, peer: str, note: str = ""
) -> list[Figure]:
    """Each side's median time per step (in ms) and their paired ratio, side / peer."""
    return [
        Figure(f"{prefix}: step, {side}", median(times[side]) * 1e3, "ms", note=note),
        Figure(f"{prefix}: step, {peer}", median(times[peer]) * 1e3, "ms"),
        Figure(
            f"{prefix}: step time, {side} / {peer}",
            paired_ratio(times[side], times[peer]),
            "x",
            lower_is_better=True,
        ),
    ]


def alternate(
    sides: dict[str, Callable[[], float]], rounds: int, warmup: bool = False
) -> dict[str, list[float]]:
    """Run each side once per round, in a rotating order; each returns its own figure.

    `warmup` runs each side once first, unmeasured: a first run pays for allocations (page
    cache, allocator arenas) that later ones reuse.
    """
    names = list(sides)
    if warmup:
        for n in names:
            sides[n]()
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            out[n].append(sides[n]())
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Service:
    url: str
    data_dir: Path
    process: subprocess.Popen[bytes]


@contextmanager
def running_service(data_dir: Path, workers: int = 1, **env: str) -> Iterator[Service]:
    """`python -m trainctl.service` on a free port with its data under `data_dir`, stopped after."""
    port = free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    full_env = {
        **os.environ,
        "TRAINCTL_HOST": "127.0.0.1",
        "TRAINCTL_PORT": str(port),
        "TRAINCTL_DATA_DIR": str(data_dir),
        "TRAINCTL_WORKERS": str(workers),
        **env,
    }
    with open(data_dir / "service.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainctl.service"],
            cwd=REPO,
            env=full_env,
            stdout=log,
            stderr=log,
        )
    svc = Service(f"http://127.0.0.1:{port}", data_dir, proc)
    try:
        wait_ready(svc, workers, token=env.get("TRAINCTL_API_TOKEN"))
        yield svc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_ready(svc: Service, workers: int, timeout: float = 120, token: str | None = None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if svc.process.poll() is not None:
            raise RuntimeError(f"service exited; see {svc.data_dir / 'service.log'}")
        try:
            r = httpx.get(f"{svc.url}/readyz", headers=headers, timeout=2)
            if r.status_code == 200 and (workers == 0 or r.json()["workers_alive"] >= workers):
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"service not ready in {timeout} s; see {svc.data_dir / 'service.log'}")


def wait_run(client: Any, run_id: str, timeout: float = 1800) -> dict[str, Any]:
    run = client.wait(run_id, timeout=timeout, poll=0.5)
    if run.state != "succeeded":
        raise RuntimeError(f"run {run_id} ended {run.state}: {run.error}")
    return dict(run.model_dump(mode="json"))

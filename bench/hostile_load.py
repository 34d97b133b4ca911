"""`/healthz` latency while hostile bodies arrive (issue 23, class 1).

Several clients POST the body that once froze the API for 45 s, 1 MB of `[1.5e4299, ...]`,
back to back, with a token and without one, while one client times `GET /healthz`. The body
is parsed and validated off the event loop, each number at a cost linear in its length
(service/routing.py), so the probe's latency stays that of a busy process, not of a frozen
one. `python -m bench.hostile_load` runs it against the real service.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.common import Figure, running_service

HOSTILE_BODY = b"[" + b",".join([b"1.5e4299"] * 110_000) + b"]"
"""The class-1 body: 990,001 bytes, under the default 1 MiB limit."""
TOKEN = "hostile-load-token"


def healthz_under_hostile_bodies(
    url: str, token: str, clients: int = 4, seconds: float = 5.0
) -> dict[str, float]:
    """p50, p99 and max `/healthz` latency (ms) while `clients` threads each POST the class-1
    body back to back (every other one with `token`), and how many of them were answered."""
    stop = threading.Event()
    answered = [0]

    def hostile(authenticated: bool) -> None:
        headers = {"Content-Type": "application/json"}
        if authenticated:
            headers["Authorization"] = f"Bearer {token}"
        with httpx.Client(base_url=url, timeout=120) as http:
            while not stop.is_set():
                http.post("/runs/train", content=HOSTILE_BODY, headers=headers)
                answered[0] += 1

    threads = [threading.Thread(target=hostile, args=(i % 2 == 0,)) for i in range(clients)]
    latencies: list[float] = []
    with httpx.Client(base_url=url, timeout=120) as probe:
        probe.get("/healthz")  # the connection is made before the clock starts
        for t in threads:
            t.start()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            probe.get("/healthz").raise_for_status()
            latencies.append((time.perf_counter() - started) * 1000)
            time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    latencies.sort()
    return {
        "p50_ms": latencies[len(latencies) // 2],
        "p99_ms": latencies[int(len(latencies) * 0.99)],
        "max_ms": latencies[-1],
        "probes": len(latencies),
        "hostile_answered": answered[0],
    }


def run(quick: bool = False) -> list[Figure]:
    seconds = 3.0 if quick else 15.0
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_service(Path(tmp), workers=0, TRAINCTL_API_TOKEN=TOKEN) as svc,
    ):
        idle = healthz_under_hostile_bodies(svc.url, TOKEN, clients=0, seconds=seconds)
        got = healthz_under_hostile_bodies(svc.url, TOKEN, seconds=seconds)
    note = f"{got['hostile_answered']:.0f} hostile bodies answered, {got['probes']:.0f} probes"
    return [
        Figure("healthz p50, idle", idle["p50_ms"], "ms", lower_is_better=True),
        Figure("healthz p50 under 4 clients of 1 MB [1.5e4299, ...]", got["p50_ms"], "ms",
               note=note, lower_is_better=True),
        Figure("healthz p99 under 4 clients of 1 MB [1.5e4299, ...]", got["p99_ms"], "ms",
               lower_is_better=True),
    ]  # fmt: skip


if __name__ == "__main__":
    for figure in run():
        print(figure.line())

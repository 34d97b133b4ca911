"""Item 6b: the API while many event streams are open.

The real service (`python -m trainctl.service`, no worker) holds `streams` open
`GET /runs/{id}/events` streams over 20 queued runs, while a client asks `/healthz` back to
back; against the same service with no stream open, alternated round by round. One feed polls
the database for every stream of the process (service/sse.py), so the ratio says what many
idle streams cost a cheap request. It was a test's printout until the suite's time mattered
more than a figure no test checks.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import Figure, median, paired_ratio, running_service

TOKEN = "bench-event-streams"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FULL: dict[str, Any] = dict(streams=200, runs=20, probes=200, rounds=5)
QUICK: dict[str, Any] = dict(streams=20, runs=4, probes=20, rounds=1)


async def open_streams(url: str, run_ids: list[str], n: int) -> list[asyncio.StreamWriter]:
    """`n` event streams over `run_ids`, each answered 200; the connections stay open."""
    target = httpx.URL(url)
    writers = []
    for i in range(n):
        reader, writer = await asyncio.open_connection(target.host, target.port)
        writer.write(
            f"GET /runs/{run_ids[i % len(run_ids)]}/events HTTP/1.1\r\nHost: {target.host}\r\n"
            f"Authorization: {AUTH['Authorization']}\r\n\r\n".encode()
        )
        status = (await reader.readuntil(b"\r\n")).split(b" ", 2)[1]
        if status != b"200":
            raise RuntimeError(f"stream {i} was answered {status.decode()}")
        writers.append(writer)
    return writers


def healthz_ms(url: str, probes: int) -> float:
    """The median /healthz latency over `probes` requests on one keep-alive connection."""
    with httpx.Client(base_url=url) as client:
        latencies = []
        for _ in range(probes):
            started = time.perf_counter()
            client.get("/healthz").raise_for_status()
            latencies.append((time.perf_counter() - started) * 1000)
    return median(latencies)


async def with_streams(url: str, run_ids: list[str], streams: int, probes: int) -> float:
    writers = await open_streams(url, run_ids, streams)
    try:
        return await asyncio.to_thread(healthz_ms, url, probes)
    finally:
        for writer in writers:
            writer.close()


def run(quick: bool = False) -> list[Figure]:
    cfg = QUICK if quick else FULL
    env = {
        "TRAINCTL_API_TOKEN": TOKEN,
        "TRAINCTL_MAX_EVENT_STREAMS": str(cfg["streams"] + 16),
        "TRAINCTL_MAX_EVENT_STREAMS_PER_TOKEN": str(cfg["streams"]),
    }
    with tempfile.TemporaryDirectory() as tmp, running_service(Path(tmp), 0, **env) as svc:
        run_ids = []
        for i in range(cfg["runs"]):
            r = httpx.post(f"{svc.url}/runs/train", headers=AUTH,
                           json={"experiment": f"e{i}", "steps": 10, "device": "cpu"})  # fmt: skip
            r.raise_for_status()
            run_ids.append(r.json()["id"])
        alone, loaded = [], []
        for _ in range(cfg["rounds"]):
            alone.append(healthz_ms(svc.url, cfg["probes"]))
            loaded.append(
                asyncio.run(with_streams(svc.url, run_ids, cfg["streams"], cfg["probes"]))
            )
    n = cfg["streams"]
    return [
        Figure("event streams: /healthz p50, none open", median(alone), "ms"),
        Figure(
            f"event streams: /healthz p50, {n} open",
            median(loaded),
            "ms",
            note=f"{cfg['runs']} queued runs, {cfg['rounds']} alternated rounds",
        ),
        Figure(
            f"event streams: {n} open / none",
            paired_ratio(loaded, alone),
            "x",
            lower_is_better=True,
        ),
    ]

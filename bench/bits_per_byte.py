"""Datasets (issue 14): bits per byte on held-out stdlib source after the same wall time, for
a `tiny` model on bytes against the same model on a 4,096-token BPE. Reported, not a target.

- Data: the standard library's source, a file a document, prepared twice with
  `prepare_dataset` and the same `val_fraction`, so both datasets hold out the same documents:
  once as bytes, once with a BPE that `train_tokenizer` trains on the byte dataset's train
  split (its shards decoded back to text), so the tokenizer never saw the held-out files.
- Training: `resolve_train` and the worker's own `train`, as a train run does (Muon + AdamW,
  WSD), preset `tiny` with `vocab_size` set to each tokenizer's. A short calibration run per
  side measures its step time (after its first steps: setup, validation and the checkpoint
  save are not steps); each side then gets the steps that fill the same time budget, so that
  its schedule decays to the end of it. The clock is the process's CPU time, not the wall
  clock: on a shared machine the wall time of a step moves with the other tenants' load (a
  first version calibrated on wall time gave one side 3.7 times the other's budget), while
  the CPU time it takes does not. Both clocks are reported.
- The figure: each side's final validation loss in bits per byte, from the held-out split's
  own bytes per token (the windows of `val_batches` batches that a train run validates on).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Figure
from trainctl.store.checkpoints.factory import open_stores
from trainctl.store.checkpoints.posix import PosixStorage
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.bucket import DatasetStore
from trainctl.store.data.datasets import Dataset, bits_per_byte
from trainctl.store.data.prepare import prepare_dataset
from trainctl.store.data.shards import read_shard, stdlib_source_files
from trainctl.store.data.tokenizer import train_tokenizer
from trainctl.store.kinds.train import TrainRequest, resolve_train
from trainctl.store.layout import DataLayout
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import Trainer

FULL: dict[str, Any] = dict(seconds=240.0, calibrate=10, files=None, vocab=4096, B=16, T=256,
                            val_batches=16)  # fmt: skip
QUICK: dict[str, Any] = dict(seconds=8.0, calibrate=6, files=300, vocab=4096, B=8, T=128,
                             val_batches=4)  # fmt: skip
VAL_FRACTION = 0.05


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    files = stdlib_source_files()[: size["files"]]
    with tempfile.TemporaryDirectory(dir=os.environ.get("TRAINCTL_BENCH_TMP")) as tmp:
        root = Path(tmp)
        datasets = root / "datasets"
        byte_data = prepare_dataset(files, datasets / "bytes", None, val_fraction=VAL_FRACTION)
        train_text = root / "train-split.txt"
        with open(train_text, "wb") as out:
            for shard in byte_data.shard_paths("train"):
                out.write(read_shard(shard).astype("uint8").tobytes())
        tokenizer = train_tokenizer([train_text], root / "tokenizer", size["vocab"])
        bpe_data = prepare_dataset(files, datasets / "bpe", tokenizer, val_fraction=VAL_FRACTION)
        assert byte_data.splits["val"].bytes == bpe_data.splits["val"].bytes  # same documents
        sides = {"bytes": byte_data, f"BPE {size['vocab']:,}": bpe_data}
        results = {name: timed_training(d, root, size) for name, d in sides.items()}
    held_out = byte_data.splits["val"]
    note = (
        f"tiny, {size['B']}x{size['T']} tokens a step, {size['seconds']:.0f} CPU s each; held "
        "out: "
        f"{held_out.documents:,} files, {held_out.bytes / 1e6:.1f} MB"
    )
    figures: list[Figure] = []
    for name, (bpb, steps, cpu, wall, d) in results.items():
        figures.append(
            Figure(f"bits per byte: {name}", bpb, "bit/B", lower_is_better=True,
                   note=f"{steps} steps in {cpu:.0f} CPU s ({wall:.0f} s wall), "
                   f"{held_out_bpt(d):.2f} bytes/token" + (f"; {note}" if not figures else ""))
        )  # fmt: skip
    byte_bpb, bpe_bpb = (r[0] for r in results.values())
    figures.append(Figure("bits per byte: bytes / BPE", byte_bpb / bpe_bpb, "x"))
    return figures


def held_out_bpt(dataset: Dataset) -> float:
    val = dataset.splits["val"]
    return val.bytes / val.tokens


def timed_training(
    dataset: Dataset, root: Path, size: dict[str, Any]
) -> tuple[float, int, float, float, Dataset]:
    """(held-out bits per byte, steps, their CPU seconds, their wall seconds, dataset) of a
    run that fills the budget."""
    datasets = open_stores(DataLayout(root)).datasets  # where `run` prepared them
    _, per_step, _ = train_on(dataset, datasets, root / "calibrate", size["calibrate"], size)
    steps = max(size["calibrate"], math.floor(size["seconds"] / per_step))
    result, per_step, wall = train_on(dataset, datasets, root / "run", steps, size)
    bpb = bits_per_byte(result["final_val_loss"], held_out_bpt(dataset))
    return bpb, steps, per_step * steps, wall, dataset


def train_on(
    dataset: Dataset, datasets: DatasetStore, checkpoints: Path, steps: int, size: dict[str, Any]
) -> tuple[dict[str, Any], float, float]:
    """(the run's result, CPU seconds a step after its first two (the first pays for
    warm-up), wall seconds of those steps)."""
    request = TrainRequest(
        model={"preset": "tiny", "overrides": {"vocab_size": dataset.vocab_size}},
        batch={"micro_batch_size": size["B"], "grad_accum_steps": 1, "seq_len": size["T"]},
        data={"source": "dataset", "dataset": dataset.folder.name},
        steps=steps, checkpoint_every=steps, val_every=steps, val_batches=size["val_batches"],
        device="cpu",
    )  # fmt: skip
    plan = resolve_train(request, cuda_available=False, data_roots=[], datasets=datasets)
    cpu: list[float] = []
    wall: list[float] = []

    def tick(*_: Any) -> None:
        cpu.append(time.process_time())
        wall.append(time.perf_counter())

    store = CheckpointStore(PosixStorage(checkpoints / dataset.folder.name))
    result = Trainer(plan, store, hooks=TrainerHooks(on_progress=tick), datasets=datasets).run()
    return result, (cpu[-1] - cpu[1]) / (len(cpu) - 2), wall[-1] - wall[1]

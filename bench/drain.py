"""Issue 26: the stall of a drain's emergency save, and how long until the run is requeued.

A real worker process (`python -m trainctl.worker`, SQLite in a temporary data dir) trains a
run that saves synchronously every few steps; once it has saved twice, the bench sends it
SIGTERM and reads, from the run's own events:

- from the signal to the step boundary the run stops at (the step in progress finishes; a
  step's time is reported beside it), and from there to the ranks stopped: the emergency
  save's stall, staging the state to host memory (the drain's async path);
- from the signal to the emergency save committed (written, hashed, fsynced, renamed in the
  background after the ranks stopped);
- the same model's synchronous save in the same run (its periodic saves' `save_seconds`);
- from the signal to the run requeued (its state event), and to the worker's exit.

The worker measures from its signal handler, the bench from `os.kill`; both read the
machine-wide clocks (`time.monotonic()` there, the event's timestamp here).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, Figure, median
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.kinds.registry import kind_of_plan, placement_of
from trainctl.store.kinds.train import TrainRequest, resolve_train

# `small` with 4 layers: 62 M parameters, about 0.75 GB of weights and optimizer state (the
# size bench/checkpoint_io.py saves); one layer for the quick run.
FULL: dict[str, Any] = dict(n_layers=4, rounds=3, every=4)
QUICK: dict[str, Any] = dict(n_layers=1, rounds=1, every=4)
PERIODIC_SAVES = 2
"""Synchronous saves each round waits for before the signal: the figure to compare with."""


def enqueue_round(runs: RunStore, size: dict[str, Any], i: int) -> Run:
    request = TrainRequest(
        experiment=f"drain-{i}",
        steps=1_000_000,  # never reached: the signal ends the attempt
        model={"preset": "small", "overrides": {"n_layers": size["n_layers"]}},
        data={"source": "synthetic"},
        batch={"micro_batch_size": 2, "seq_len": 64},
        checkpoint_every=size["every"],
        val_every=1_000_000,
        val_batches=1,
        max_keep=1,
    )
    plan = resolve_train(request, cuda_available=False, data_roots=[])
    spec = plan.model_dump(mode="json")
    return runs.enqueue(
        kind_of_plan(plan).name, plan.filed_under, spec, placement=placement_of(plan)
    )


def logged(runs: RunStore, run: Run, key: str) -> list[dict[str, Any]]:
    return [e.data[key] for e in runs.events(run.id, type="log") if key in e.data]


def wait_for(predicate: Any, what: str, timeout: float = 600.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        time.sleep(0.02)
    raise RuntimeError(f"timed out waiting for {what}")


def one_round(runs: RunStore, data_dir: Path, size: dict[str, Any], i: int) -> dict[str, float]:
    run = enqueue_round(runs, size, i)
    command = [sys.executable, "-m", "trainctl.worker", "--data-dir", str(data_dir),
               "--worker-id", f"drain-{i}", "--heartbeat-seconds", "0.5"]  # fmt: skip
    with open(data_dir / f"worker-{i}.log", "wb") as log:
        proc = subprocess.Popen(command, cwd=REPO, stderr=log, env=dict(os.environ))
    try:
        saves = wait_for(
            lambda: len(s := logged(runs, run, "checkpoint")) >= PERIODIC_SAVES and s,
            "the periodic saves",
        )
        signalled = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=600)
        exited = time.time()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (drain,) = logged(runs, run, "drain")
    requeued = runs.events(run.id, type="state")[-1]
    assert requeued.data["state"] == "queued", requeued.data
    if drain["committed_seconds"] is None:
        raise RuntimeError(f"the drain's save did not commit: {drain['abandoned']}")
    steps = [e.data["step_time_sec"] for e in runs.events(run.id, type="metrics")
             if "step_time_sec" in e.data]  # fmt: skip
    return {
        "step": median(steps),
        "boundary": drain["step_boundary_seconds"],
        "stall": drain["stopped_seconds"] - drain["step_boundary_seconds"],
        "stopped": drain["stopped_seconds"],
        "committed": drain["committed_seconds"],
        "sync": median([s["save_seconds"] for s in saves]),
        "requeued": requeued.created_at.timestamp() - signalled,
        "exited": exited - signalled,
    }


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(dir=os.environ.get("TRAINCTL_BENCH_TMP")) as tmp:
        data_dir = Path(tmp)
        with RunStore(f"sqlite:///{data_dir / 'trainctl.db'}") as runs:
            runs.create_all()
            rounds = [one_round(runs, data_dir, size, i) for i in range(size["rounds"])]
    got = {k: median([r[k] for r in rounds]) for k in rounds[0]}
    note = f"small preset, {size['n_layers']} layer(s), CPU, {size['rounds']} round(s)"
    return [
        Figure("drain: one training step", got["step"], "s", note=note),
        Figure("drain: signal -> step boundary", got["boundary"], "s"),
        Figure(
            "drain: emergency save's stall (stage to host memory)",
            got["stall"],
            "s",
            note="from the step boundary to the ranks stopped",
        ),
        Figure("drain: synchronous save of the same model, same run", got["sync"], "s"),
        Figure(
            "drain: emergency stall / synchronous save",
            got["stall"] / got["sync"],
            "x",
            lower_is_better=True,
        ),
        Figure("drain: signal -> ranks stopped", got["stopped"], "s"),
        Figure("drain: signal -> emergency save committed", got["committed"], "s"),
        Figure("drain: signal -> run requeued", got["requeued"], "s"),
        Figure("drain: signal -> worker exited", got["exited"], "s"),
    ]

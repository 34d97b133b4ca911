"""Issue 44: the time from a hang to the run training again, against the NCCL watchdog's
10 minutes.

A real worker process (`python -m trainctl.worker`, SQLite in a temporary data dir) trains a
two-rank gloo run (torchrun) that saves every few steps. Rank 1 stops itself with SIGSTOP as
it starts the step after a save (`TRAINCTL_TEST_RANK_FAULT`, docs/design/hangs.md,
"Settings"); rank 0 then waits in the step's collective, as the ranks of a gang wait on a hung
peer. From the run's own events (the store's clock):

- from the hang (the last step reported before it) to the hang declared (its `hang` log line);
- from there to the run requeued (its state event);
- from the hang to the run training again (the first step the next attempt reports, resumed
  from the checkpoint before the hang);
- and what the watch costs a rank per step (`RankPulse`'s slot writes and learned timeout).

Two hang settings: the defaults (`floor_seconds` 60: a tiny step's learned timeout is the
floor) and a floor of 5 s. The figure to beat is what a hang costs without the watch: the
NCCL watchdog's 10 minutes before anything fails (gloo's default timeout is 30).
"""

from __future__ import annotations

import os
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
from trainctl.store.training.hangs import HangOptions
from trainctl.worker.training.hangs import FAULT_VARIABLE, ProgressBoard, RankPulse

NCCL_WATCHDOG_SECONDS = 600.0
EVERY = 4
STOP_AFTER = 2 * EVERY  # past the default warm-up (5 steps), right after a save
FULL: dict[str, Any] = dict(floors=[60.0, 5.0], rounds=1)
QUICK: dict[str, Any] = dict(floors=[5.0], rounds=1)


def enqueue_round(runs: RunStore, floor: float, i: int) -> Run:
    request = TrainRequest(
        experiment=f"hang-{i}",
        steps=STOP_AFTER + EVERY,
        model={"preset": "tiny"},
        data={"source": "synthetic"},
        batch={"micro_batch_size": 2, "seq_len": 32, "grad_accum_steps": 2},
        nproc_per_node=2,
        checkpoint_every=EVERY,
        val_every=1_000_000,
        val_batches=1,
        log_every=1,
        hang={"floor_seconds": floor},
    )
    plan = resolve_train(request, cuda_available=False, data_roots=[])
    spec = plan.model_dump(mode="json")
    return runs.enqueue(
        kind_of_plan(plan).name, plan.filed_under, spec, placement=placement_of(plan)
    )


def wait_for(runs: RunStore, run: Run, timeout: float = 900.0) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = runs.get(run.id)
        if now.state in ("succeeded", "failed", "cancelled"):
            return now
        time.sleep(0.2)
    raise RuntimeError(f"run {run.id} did not end within {timeout:g} s")


def one_round(runs: RunStore, data_dir: Path, floor: float, i: int) -> dict[str, float]:
    run = enqueue_round(runs, floor, i)
    command = [sys.executable, "-m", "trainctl.worker", "--data-dir", str(data_dir),
               "--worker-id", f"hang-{i}", "--heartbeat-seconds", "0.5"]  # fmt: skip
    env = dict(os.environ) | {FAULT_VARIABLE: f"1:stop:{STOP_AFTER}"}
    with open(data_dir / f"worker-{i}.log", "wb") as log:
        proc = subprocess.Popen(command, cwd=REPO, stderr=log, env=env)
    try:
        done = wait_for(runs, run)
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    assert done.state == "succeeded", done.error
    events = runs.events(run.id)
    steps = [e for e in events if e.type == "metrics" and "loss" in e.data]
    hung_at = next(e for e in steps if e.data["step"] == STOP_AFTER).created_at
    declared = next(e for e in events if e.type == "log" and "hang" in e.data)
    requeued = next(e for e in events if e.type == "state" and e.id > declared.id)
    again = next(e for e in steps if e.id > requeued.id)
    times = [e.data["step_time_sec"] for e in steps if "step_time_sec" in e.data]
    return {
        "step": median(times),
        "declared": (declared.created_at - hung_at).total_seconds(),
        "requeued": (requeued.created_at - declared.created_at).total_seconds(),
        "training": (again.created_at - hung_at).total_seconds(),
    }


def pulse_seconds(steps: int = 20_000) -> float:
    """What the hang watch costs a rank per step: its three slot writes and the learned
    timeout (`RankPulse`), with a window of 100 step times."""
    with tempfile.TemporaryDirectory() as tmp:
        pulse = RankPulse(ProgressBoard.create(Path(tmp), 1), 0, 0, HangOptions())
        started = time.perf_counter()
        for step in range(steps):
            pulse.start_step(step)
            pulse.stepped(0.1)
            pulse.section(step + 1)
        return (time.perf_counter() - started) / steps


def run(quick: bool = False) -> list[Figure]:
    size = QUICK if quick else FULL
    figures: list[Figure] = [Figure("hang watch: a rank's cost per step", pulse_seconds(), "s")]
    with tempfile.TemporaryDirectory(dir=os.environ.get("TRAINCTL_BENCH_TMP")) as tmp:
        data_dir = Path(tmp)
        with RunStore(f"sqlite:///{data_dir / 'trainctl.db'}") as runs:
            runs.create_all()
            for floor in size["floors"]:
                rounds = [
                    one_round(runs, data_dir, floor, len(figures) * 10 + i)
                    for i in range(size["rounds"])
                ]
                got = {k: median([r[k] for r in rounds]) for k in rounds[0]}
                name = f"hang (floor {floor:g} s)"
                note = f"tiny preset, 2 gloo ranks, CPU, {size['rounds']} round(s)"
                figures += [
                    Figure(f"{name}: one training step", got["step"], "s", note=note),
                    Figure(f"{name}: hang -> declared", got["declared"], "s"),
                    Figure(f"{name}: declared -> run requeued", got["requeued"], "s"),
                    Figure(f"{name}: hang -> training again", got["training"], "s"),
                    Figure(
                        f"{name}: hang -> training again / NCCL watchdog",
                        got["training"] / NCCL_WATCHDOG_SECONDS,
                        "x",
                        target=1.0,
                        lower_is_better=True,
                    ),
                ]
    return figures

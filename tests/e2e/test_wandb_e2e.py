"""Metrics out to Weights & Biases, end to end: the real service and worker train with the
`wandb` tracker in offline mode, and what the service's W&B client wrote under the data dir is
read back with wandb's own reader (`wandb leet inspect`): every metric at its step, one W&B run
across two attempts after the worker is killed with SIGKILL, the plan as the config,
checkpoints as artifacts by reference, and a fork's `fork_from`."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from typing import Any

import pytest

from tests.e2e.runs import wait_done
from tests.support.polling import poll
from tests.support.service_process import Service
from tests.support.wandb_files import WandbFile, history_rows, table_rows, wandb_files
from trainctl.service.schemas import EventPublic
from trainctl.service.sdk.client import TrainctlClient
from trainctl.service.sinks.base import scalars
from trainctl.service.sinks.wandb import wandb_id

WANDB_OFFLINE = {
    "TRAINCTL_WANDB_PROJECT": "trainctl-e2e",
    "TRAINCTL_WANDB_MODE": "offline",
    "TRAINCTL_TRACKERS": "wandb",  # every run, its spec naming none
    "TRAINCTL_SINK_POLL_SECONDS": "0.2",
    "TRAINCTL_SINK_RETRY_MAX_SECONDS": "1",
}
# The worker is killed between two checkpoints (CHECKPOINT_EVERY apart), a few steps past the
# last, so that its second attempt repeats the steps since: W&B must take each once.
STEPS = 60  # past KILL_PAST by more than the steps a loaded poll can miss
CHECKPOINT_EVERY = 10
KILL_PAST = 12
STDLIB = {"source": "stdlib", "max_bytes": 1_000_000}
SMALL = {"batch": {"micro_batch_size": 2, "grad_accum_steps": 1, "seq_len": 64}, "val_batches": 1}


def first_metrics(events: list[EventPublic]) -> dict[tuple[str, int], float]:
    """Each (name, step) of the run's train and validation metrics with the value first
    logged: a resumed attempt repeats steps, W&B takes each once."""
    found: dict[tuple[str, int], float] = {}
    for e in events:
        if e.type == "metrics" and e.data.get("kind") in ("train", "val"):
            for name, value in scalars(e.data):
                found.setdefault((name, e.data["step"]), value)
    return found


def config_of(read: WandbFile) -> dict[str, Any]:
    config: dict[str, Any] = read.runs[0]["config"]["update"]
    return config


def kill_between_checkpoints(client: TrainctlClient, run_id: str) -> None:
    """SIGKILL the run's worker once it has logged a step past its newest checkpoint. Its
    steps are sampled (progress is written at most twice a second) and a CPU step takes
    tens of milliseconds, so the worker is stopped (SIGSTOP) first and what it wrote is read
    while it cannot write more: a window of steps watched from outside was once run through
    unseen, the whole run in 3.6 s."""
    while True:
        running = poll(
            lambda: (
                (r := client.get_run(run_id)).state == "running"
                and (r.progress.step or 0) > KILL_PAST
                and r
            ),
            timeout=120,
            what="the run past its first checkpoint",
        )
        worker = next(w for w in client.workers() if w.id == running.worker_id)
        os.kill(worker.pid, signal.SIGSTOP)
        logged = max(int((m.model_extra or {})["step"]) for m in client.metrics(run_id, "train"))
        saved = max((c.step or 0 for c in client.list_checkpoints("wb")), default=0)
        if logged > saved:
            os.kill(worker.pid, signal.SIGKILL)
            return
        os.kill(worker.pid, signal.SIGCONT)  # stopped just as it saved: one step more

        def past(seen: int = logged) -> bool:
            return (client.get_run(run_id).progress.step or 0) > seen

        poll(past, timeout=60)


def test_a_killed_workers_run_and_its_fork_land_in_wandb_once_each(service: Service) -> None:
    # W&B's client stages tables under WANDB_DATA_DIR (default ~/.local/share/wandb).
    service.extra_env |= WANDB_OFFLINE | {"WANDB_DATA_DIR": str(service.data_dir / "wandb-data")}
    service.start()
    spec = {"experiment": "wb", "steps": STEPS, "log_every": 1, "data": STDLIB, **SMALL,
            "checkpoint_every": CHECKPOINT_EVERY, "max_keep": STEPS // CHECKPOINT_EVERY,
            "val_every": 10, "sample_every": 10,
            "sample_prompts": ["def "], "sample_settings": {"max_new_tokens": 4}}  # fmt: skip
    with TrainctlClient(service.url) as client:
        run = client.submit("train", spec)
        assert run.spec["trackers"] == ["wandb"]
        kill_between_checkpoints(client, run.id)
        done = wait_done(client, run.id)
        assert done.state == "succeeded", done.error
        assert done.attempt == 2
        fork = client.submit(
            "train",
            {"experiment": "wb-fork", "steps": STEPS + 5, "log_every": 1,
             "fork_from": f"wb/step_{STEPS}", "data": STDLIB, **SMALL},
        )  # fmt: skip
        assert wait_done(client, fork.id).state == "succeeded"
        events = list(client.events(run.id))
        fork_events = list(client.events(fork.id))
        # Mirrored and finished: the sink wrote the W&B run's exit record.
        poll(
            lambda: all(
                (f := wandb_files(service.data_dir, wandb_id(r))) and f[-1].exits
                for r in (run.id, fork.id)
            ),
            timeout=60,
            what="W&B to catch up",
            interval=0.5,
        )

    (read,) = wandb_files(service.data_dir, wandb_id(run.id))  # one W&B run, both attempts
    steps = [row["_step"] for row in read.history]
    assert steps == sorted(set(steps)), "a step was logged twice or out of order"
    replayed = [e for e in events if e.type == "metrics" and e.data.get("kind") == "train"]
    assert len(replayed) > STEPS  # the second attempt repeated steps the first had logged
    rows = history_rows([read])
    expected = first_metrics(events)
    assert {k: rows.get(k) for k in expected} == expected
    assert {"train/loss", "train/lr/muon", "train/lr/adamw", "train/tokens_per_sec",
            "val/loss"} <= {name for name, _ in expected}  # fmt: skip
    samples: dict[int, list[Any]] = {}  # each step's sample as first logged
    for e in events:
        if e.type == "sample":
            samples.setdefault(
                e.data["step"], [e.data[k] for k in ("step", "prompt", "completion")]
            )
    assert samples and {step for (name, step) in rows if name == "samples._type"} == set(samples)
    assert sorted(table_rows([read], "samples")) == sorted(samples.values())

    (record,) = read.runs
    assert record["run_id"] == wandb_id(run.id) and record["project"] == "trainctl-e2e"
    assert run.id in record["notes"] and "trainctl" in record["tags"]
    config = config_of(read)
    assert config["steps"] == STEPS and config["optimizer"] == done.spec["optimizer"]
    assert read.exits == [{"exit_code": 0}] or read.exits[-1].get("exit_code", 0) == 0

    # Checkpoints by reference: the manifest's location and sha256, no file of the weights.
    # Every save is kept (max_keep): one pruned before the mirror reached it has nothing to
    # point at and is left out (service/sinks/wandb.py).
    saves = {
        (c["tag"], c["step"]) for e in events if isinstance(c := e.data.get("checkpoint"), dict)
    }
    models = [(json.loads(a["metadata"]), a) for a in read.artifacts if a["type"] == "model"]
    assert {(meta["tag"], meta["step"]) for meta, _ in models} == saves
    saved = {meta["tag"]: a for meta, a in models if meta["step"] == STEPS}
    final = saved[f"step_{STEPS}"]
    manifest = service.data_dir / "checkpoints" / "wb" / f"step_{STEPS}" / "manifest.json"
    meta = json.loads(final["metadata"])
    assert meta["manifest_sha256"] == hashlib.sha256(manifest.read_bytes()).hexdigest()
    (entry,) = final["manifest"]["contents"]
    assert entry["ref"] == manifest.as_uri() and "local_path" not in entry

    (forked,) = wandb_files(service.data_dir, wandb_id(fork.id))
    (fork_record,) = forked.runs
    assert fork_record["branch_point"] == {"metric": "_step", "run": wandb_id(run.id),
                                           "value": STEPS}  # fmt: skip
    fork_steps = [row["_step"] for row in forked.history]
    assert fork_steps and min(fork_steps) > STEPS
    assert {k: history_rows([forked]).get(k) for k in first_metrics(fork_events)} == (
        first_metrics(fork_events)
    )


@pytest.mark.soak  # a second service start and a longer run: make test covers it in-process
def test_a_service_restart_mid_run_resumes_the_same_wandb_run(service: Service) -> None:
    """The service stops mid-run (its worker hands the run back at a checkpoint) and starts
    again: its W&B client opens the same W&B run a second time (resume), and between the two
    `.wandb` files every step is logged once."""
    service.extra_env |= WANDB_OFFLINE | {"WANDB_DATA_DIR": str(service.data_dir / "wandb-data")}
    service.start()
    spec = {"experiment": "wb-restart", "steps": STEPS, "log_every": 1, "data": STDLIB,
            "checkpoint_every": 5, **SMALL}  # fmt: skip
    with TrainctlClient(service.url) as client:
        run = client.submit("train", spec)
        poll(lambda: (client.get_run(run.id).progress.step or 0) > KILL_PAST, 300, "steps")
    assert service.stop()
    service.start()
    with TrainctlClient(service.url) as client:
        assert wait_done(client, run.id).state == "succeeded"
        events = list(client.events(run.id))
        poll(
            lambda: len(f := wandb_files(service.data_dir, wandb_id(run.id))) == 2 and f[-1].exits,
            timeout=120,
            what="the second service's W&B file",
            interval=0.5,
        )
    files = wandb_files(service.data_dir, wandb_id(run.id))
    steps = [row["_step"] for f in files for row in f.history]
    assert steps == sorted(set(steps)), "a step was logged twice or out of order"
    expected = first_metrics(events)
    assert {k: history_rows(files).get(k) for k in expected} == expected
    assert {r["run_id"] for f in files for r in f.runs} == {wandb_id(run.id)}

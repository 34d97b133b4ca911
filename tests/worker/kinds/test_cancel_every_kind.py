"""Every kind of run stops within a bounded time of a cancel, whatever its inner loop
(docs/design/runs.md, "Runs", "Cancel"): each is given work that takes minutes on this CPU (an
evaluation of every hellaswag item 25-shot, thousands of validation batches, thousands of
tokens for many prompts, ...), cancelled once it is at work, and must end `cancelled` within
`BOUND` seconds, through `execute` as the worker runs it, against a real SQLite run store.

An export of any model here takes well under a second, so it is cancelled before it starts:
it must notice at its first tensor, not run to the end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.checkpoints import save_checkpoint
from tests.support.plans import benchmark_plan, train_plan, validate_plan
from tests.support.stores import posix_store
from trainctl.store.checkpoints.factory import open_stores
from trainctl.store.db.runs import RunStore
from trainctl.store.kinds.evaluate import EvaluateRequest, resolve_evaluate
from trainctl.store.kinds.export import ExportRequest, resolve_export
from trainctl.store.kinds.registry import RUN_KINDS, kind_of_plan, placement_of
from trainctl.store.kinds.sample import SampleRequest, resolve_sample
from trainctl.store.layout import DataLayout
from trainctl.store.plans import Plan
from trainctl.worker.context import RunContext
from trainctl.worker.executor import Outcome, WorkerEnv
from trainctl.worker.kinds.registry import execute
from trainctl.worker.models.gpt import build_model
from trainctl.worker.training.optim import build_optimizers
from trainctl.worker.training.schedule import build_scheduler

WORKER = "worker-1"
BOUND = 20.0  # seconds from the cancel to the outcome; every unit of work here is far shorter
BYTES = {"tokenizer": {"kind": "bytes", "sha256": None, "eot_id": None}, "dataset": None}
CHECKPOINT = {"experiment": "lm", "checkpoint": "latest"}


def evaluate(checkpoints: Path) -> Plan:
    request = EvaluateRequest(
        **CHECKPOINT, tasks=["hellaswag"], limit=100_000, num_fewshot=25, batch_size=16
    )
    return resolve_evaluate(request, cuda_available=False, checkpoints=posix_store(checkpoints))


def validate(checkpoints: Path) -> Plan:
    return validate_plan(
        checkpoints, **CHECKPOINT, data={"source": "synthetic"}, batch_size=64, num_batches=20_000
    )


def sample(checkpoints: Path) -> Plan:
    """64 prompts of 4,000 tokens each from the long-context checkpoint."""
    request = SampleRequest(
        experiment="long",
        checkpoint="latest",
        prompts=["def "] * 64,
        generation={"max_new_tokens": 4_000, "temperature": 1.0},
    )
    return resolve_sample(request, cuda_available=False, checkpoints=posix_store(checkpoints))


def export(checkpoints: Path) -> Plan:
    stores = posix_store(checkpoints), posix_store(checkpoints.parent / "exports")
    return resolve_export(ExportRequest(**CHECKPOINT), checkpoints=stores[0], exports=stores[1])


def benchmark(checkpoints: Path) -> Plan:
    return benchmark_plan(
        model={"preset": "tiny"}, batch={"micro_batch_size": 8, "seq_len": 256},
        warmup_steps=5_000, steps=5_000,
    )  # fmt: skip


def train(checkpoints: Path) -> Plan:
    """Validation (10,000 batches) at every step: the step boundary comes late."""
    return train_plan(
        experiment="trained", steps=1_000, model={"preset": "tiny"}, data={"source": "synthetic"},
        batch={"micro_batch_size": 8, "seq_len": 256}, val_every=1, val_batches=10_000,
        checkpoint_every=1_000,
    )  # fmt: skip


PLANS: dict[str, tuple[Callable[[Path], Plan], float | None]] = {
    # kind: (its plan, seconds of work before the cancel; None: cancelled before it starts)
    "evaluate": (evaluate, 3.0),
    "validate": (validate, 3.0),
    "sample": (sample, 3.0),
    "export": (export, None),
    "benchmark": (benchmark, 3.0),
    "train": (train, 3.0),
}
"""prepare: tests/worker/kinds/test_prepare_run.py (its reading stops per batch of records)."""


def test_every_built_in_kind_is_covered_here_or_by_its_own_cancel_test() -> None:
    assert set(RUN_KINDS.names()) == {*PLANS, "prepare"}


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data dir with byte-level tiny checkpoints: lm/step_8, and long/step_8 of a context of
    4,096 tokens."""
    sizes: tuple[tuple[str, dict[str, Any]], ...] = (("lm", {}), ("long", {"max_seq_len": 4096}))
    for experiment, overrides in sizes:
        model = build_model("tiny", seed=0, **overrides)
        optimizers = build_optimizers(model)
        scheduler = build_scheduler(optimizers, 100)
        folder = tmp_path / "checkpoints" / experiment
        save_checkpoint(model, optimizers, scheduler, 8, 800, 2.5, folder, extra=BYTES)
    return tmp_path


def cancel(runs: RunStore, data_dir: Path, kind: str, work: float | None) -> tuple[Outcome, float]:
    """Run a `kind` run through `execute`, cancelled after `work` seconds (None: between its
    claim and its start); its outcome, and the seconds from the cancel to it."""
    plan = PLANS[kind][0](data_dir / "checkpoints")
    assert kind_of_plan(plan).name == kind
    runs.workers.register(WORKER, host="test", pid=1, device="cpu", info={})
    queued = runs.enqueue(
        kind, plan.filed_under, plan.model_dump(mode="json"), placement=placement_of(plan)
    )
    run = runs.claim(WORKER, lease_seconds=600)
    assert run is not None and run.id == queued.id
    if work is None:
        runs.request_cancel(run.id)
    outcome: list[Outcome] = []
    failure: list[BaseException] = []
    env = WorkerEnv(open_stores(DataLayout(data_dir)))

    def work_on() -> None:
        try:
            with RunContext(run, runs, WORKER, threading.Event(), lease_seconds=600) as ctx:
                outcome.append(execute(ctx, env))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=work_on, daemon=True)
    thread.start()
    if work is not None:
        thread.join(timeout=work)
        assert thread.is_alive(), f"the {kind} run ended before its cancel: {outcome or failure}"
        runs.request_cancel(run.id)
    cancelled = time.monotonic()
    thread.join(timeout=BOUND)
    took = time.monotonic() - cancelled

    assert not thread.is_alive(), f"the {kind} run still works {BOUND:.0f} s after its cancel"
    assert not failure, failure
    return outcome[0], took


@pytest.mark.parametrize("kind", list(PLANS))
def test_a_cancelled_run_of_every_kind_ends_cancelled_within_the_bound(
    kind: str, runs: RunStore, data_dir: Path
) -> None:
    outcome, took = cancel(runs, data_dir, kind, PLANS[kind][1])
    assert outcome.state == "cancelled", outcome
    assert took < BOUND


@pytest.mark.parametrize("kind", list(PLANS))
def test_a_run_cancelled_between_its_claim_and_its_start_ends_cancelled_with_no_result(
    kind: str, runs: RunStore, data_dir: Path
) -> None:
    """The cancel is read before the first unit of work, not at the reporter thread's first
    turn: an export, which ends in well under a second, once ran to the end under load."""
    outcome, _ = cancel(runs, data_dir, kind, None)
    assert outcome.state == "cancelled", outcome
    assert outcome.result == {"stopped": True}, outcome

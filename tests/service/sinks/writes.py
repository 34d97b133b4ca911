"""What the sink tests write into a run store as a worker would (a train run's metrics,
validation and samples, an evaluate run's scores), and how they drive a mirror by hand."""

from __future__ import annotations

from collections.abc import Callable

from trainctl.service.sinks.mirror import SinkMirror
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.kinds.train import TrainRequest, resolve_train

WORKER = "test-worker"
PROMPTS = ["def ", "import "]
MirrorFactory = Callable[..., SinkMirror]


def start_run(store: RunStore, trackers: list[str]) -> Run:
    request = TrainRequest(
        experiment="exp", steps=20, trackers=trackers, sample_every=10, sample_prompts=PROMPTS
    )
    plan = resolve_train(
        request,
        cuda_available=False,
        data_roots=[],
        mlflow_configured=True,
        wandb_project="unit",
    )
    store.enqueue("train", "exp", plan.model_dump(mode="json"))
    run = store.claim(WORKER, lease_seconds=60)
    assert run is not None
    return run


def write_steps(store: RunStore, run: Run, steps: range) -> None:
    """What a train run writes: train metrics each step, then validation and samples. Its
    first steps name the learning rates as trainctl did before optimizers had names, as a run
    that a newer worker resumed has them."""
    for step in steps:
        lrs = (
            {"lr_muon": 0.02, "lr_adamw": 3e-4} if step < 5 else {"lr/muon": 0.02, "lr/adamw": 3e-4}
        )
        train = {"kind": "train", "step": step, "total_steps": 20, "loss": 5.0 - step / 10,
                 "grad_norm": 1.0 + step, **lrs, "tokens": step * 64,
                 "tokens_per_sec": 1000.0 + step, "step_time_sec": 0.01}  # fmt: skip
        store.append_event(run.id, "metrics", train, worker_id=WORKER, attempt=run.attempt)
        if step % 10 == 0:
            val = {"kind": "val", "step": step, "val_loss": 4.5 - step / 20, "val_ppl": 90.0,
                   "val_bits_per_byte": 6.5, "best_loss": None}  # fmt: skip
            store.append_event(run.id, "metrics", val, worker_id=WORKER, attempt=run.attempt)
            for prompt in PROMPTS:
                sample = {"step": step, "prompt": prompt, "completion": f"x{step}",
                          "finish_reason": "length", "seed": 0}  # fmt: skip
                store.append_event(run.id, "sample", sample, worker_id=WORKER, attempt=run.attempt)


def finish(store: RunStore, run: Run) -> None:
    store.finish(run.id, WORKER, run.attempt, "succeeded", result={"step": 20})


def record_scores(store: RunStore, run: Run, step: int, acc: float) -> None:
    """What an evaluate run of the run's checkpoint at `step` records on it when it ends
    (worker/kinds/evaluate.py): every score at the checkpoint's step."""
    scores = {"kind": "eval", "step": step, "evaluate_run": f"eval-{step}",
              "eval/arc_easy/acc": acc, "eval/arc_easy/acc_norm": acc + 0.125,
              "eval/arc_easy/bits_per_byte": 1.5, "eval/mmlu_anatomy/acc": 0.25}  # fmt: skip
    store.append_event(run.id, "metrics", scores)


def run_until_idle(sink_mirror: SinkMirror, ticks: int = 100) -> None:
    for _ in range(ticks):
        if not sink_mirror.tick():
            return
    raise AssertionError(f"still busy after {ticks} ticks")

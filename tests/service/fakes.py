"""What a worker would write, written without one: a checkpoint in the store, a run finished."""

from __future__ import annotations

import json
from typing import Any

from trainctl.store.checkpoints.manifests import METADATA_FILE, MODEL_FILE, OPTIMIZER_FILE
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.records import Run
from trainctl.store.db.runs import RunStore
from trainctl.store.models.presets import get_preset
from trainctl.store.names import step_tag


def save_checkpoint(
    ckpts: CheckpointStore,
    experiment: str,
    tag: str | None = None,
    *,
    step: int = 10,
    best_loss: float | None = None,
    model_config: dict[str, Any] | None = None,
    weights: bytes = b"weights " * 100,
    metadata: dict[str, Any] | None = None,
) -> None:
    """A complete fake checkpoint, written as the worker writes one (no torch needed);
    `metadata` adds to (or replaces) its metadata.json's fields."""
    tag = tag or step_tag(step)
    fields = {
        "step": step,
        "token_count": step * 1024,
        "best_loss": best_loss,
        "run_id": "run-1",
        "created_at": f"2025-01-01T00:00:{step % 60:02d}+00:00",
        "model_config": model_config or get_preset("tiny").to_dict(),
        **(metadata or {}),
    }
    with ckpts.stage(experiment, tag) as staged:
        staged.write(MODEL_FILE, weights)
        staged.write(OPTIMIZER_FILE, b"optimizer state " * 10)
        staged.write(METADATA_FILE, json.dumps(fields).encode())
        staged.commit()


def finish(runs: RunStore, run_id: str, state: str = "succeeded") -> Run:
    """Claim the oldest queued run (it must be `run_id`) and finish it, as a worker would."""
    run = runs.claim("test-worker", lease_seconds=60)
    assert run is not None and run.id == run_id
    return runs.finish(run.id, "test-worker", run.attempt, state)

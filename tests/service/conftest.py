"""Fixtures: the app on a temporary data dir with no worker processes, and its stores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.store.checkpoints.manifests import METADATA_FILE, MODEL_FILE, OPTIMIZER_FILE
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.runs import Run, RunStore
from trainctl.store.names import step_tag
from trainctl.store.presets import get_preset


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, workers=0)


@pytest.fixture
def app(settings: Settings) -> FastAPI:
    return create_app(settings)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    # The context runs the lifespan; localhost: a loopback service answers only to its names.
    with TestClient(app, base_url="http://localhost") as test_client:
        yield test_client


@pytest.fixture
def runs(client: TestClient) -> RunStore:
    store: RunStore = client.app.state.runs  # type: ignore[attr-defined]
    return store


@pytest.fixture
def ckpts(client: TestClient) -> CheckpointStore:
    store: CheckpointStore = client.app.state.checkpoints  # type: ignore[attr-defined]
    return store


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

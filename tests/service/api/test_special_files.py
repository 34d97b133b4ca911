"""A FIFO or a hardlink planted in a checkpoint, met by the real API over HTTP (uvicorn on
loopback): every read answers at once and serves nothing of it, and the service goes on
answering (docs/design/checkpoints.md, "Checkpoint store", "No links, bounded reads")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from tests.service.serving import serve
from tests.support.special_files import BLOCKED_AFTER_SECONDS, plant
from tests.support.stores import folder, manifest_of, posix_store, write_entry
from trainctl.store.checkpoints.manifests import (
    MANIFEST_FILE,
    METADATA_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
)
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.models.presets import get_preset

SECRET = b"the bytes of a file outside the store " * 40


@pytest.fixture
def url(app: FastAPI) -> Iterator[str]:
    with serve(app) as served:
        yield served


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    """The served app's checkpoint store (its data dir is tmp_path), from the outside."""
    return posix_store(tmp_path / "checkpoints")


def save(store: CheckpointStore, step: int, weights: bytes = b"weights " * 100) -> Path:
    metadata = {
        "step": step,
        "token_count": step * 1024,
        "best_loss": None,
        "run_id": "run-1",
        "created_at": f"2025-01-01T00:00:{step:02d}+00:00",
        "model_config": get_preset("tiny").to_dict(),
    }
    found = {
        MODEL_FILE: weights,
        OPTIMIZER_FILE: b"o" * 80,
        METADATA_FILE: json.dumps(metadata).encode(),
    }
    write_entry(store, "exp", f"step_{step}", {**found, MANIFEST_FILE: manifest_of(found)})
    return folder(store, "exp", f"step_{step}")


def get(url: str, path: str) -> httpx.Response:
    """One GET on a connection of its own, failing the test if it is not answered: a
    handler blocked on a FIFO never answers."""
    return httpx.get(f"{url}{path}", timeout=BLOCKED_AFTER_SECONDS)


def answers_around_the_planted_step_2(url: str, name: str) -> None:
    listing = get(url, "/checkpoints")
    assert listing.status_code == 200
    assert [c["tag"] for c in listing.json()["items"]] == ["step_1"]
    assert get(url, "/checkpoints/latest?experiment=exp").json()["tag"] == "step_1"
    for path in [
        "/checkpoints/exp/step_2",
        f"/checkpoints/exp/step_2/files/{name}",
        "/checkpoints/exp/step_2/archive",
    ]:
        response = get(url, path)
        assert response.status_code == 404, (path, response.content[:200])
        assert SECRET[:32] not in response.content
    assert get(url, "/healthz").status_code == 200


@pytest.mark.parametrize("name", [MODEL_FILE, METADATA_FILE, MANIFEST_FILE])
def test_a_fifo_in_a_checkpoint_blocks_no_request_and_is_never_served(
    url: str, store: CheckpointStore, name: str
) -> None:
    save(store, 1)
    plant(save(store, 2) / name, "fifo")

    answers_around_the_planted_step_2(url, name)


def test_a_hardlink_out_of_the_store_is_not_served_though_the_manifest_has_its_hash(
    url: str, store: CheckpointStore, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(SECRET)
    save(store, 1)
    plant(save(store, 2, weights=SECRET) / MODEL_FILE, "hardlink", secret)

    answers_around_the_planted_step_2(url, MODEL_FILE)

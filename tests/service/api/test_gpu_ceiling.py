"""A run that no GPU could hold is refused at submit even while no GPU worker is live: the
ceiling is TRAINCTL_MAX_GPU_MEMORY_BYTES, by default the largest GPU sold (service/devices.py,
store/training/memory.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.fakes import save_checkpoint
from trainctl.service import devices
from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.runs import RunStore
from trainctl.store.models.presets import get_preset
from trainctl.store.training.memory import LARGEST_GPU_MEMORY_BYTES

# Inside every documented bound, yet about 1.2 TiB of activations: no GPU there is holds it.
HUGE = {"model": {"preset": "base"}, "batch": {"micro_batch_size": 4096, "seq_len": 256}}
SMALL = {"model": {"preset": "tiny"}, "batch": {"micro_batch_size": 8, "seq_len": 256}}


@pytest.fixture(autouse=True)
def no_local_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This node has no GPU to ask, whatever machine the tests run on."""
    monkeypatch.setattr(devices, "gpu_memory_bytes", lambda: None)


def service(tmp_path: Path, **settings: Any) -> Iterator[TestClient]:
    app = create_app(Settings(data_dir=tmp_path, workers=0, **settings))
    with TestClient(app, base_url="http://localhost") as client:
        yield client


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    yield from service(tmp_path)


def train(client: TestClient, body: dict[str, Any]) -> Any:
    base = {"steps": 10, "device": "cuda", "data": {"source": "synthetic"}}
    return client.post("/runs/train", json=base | body)


def test_a_cuda_run_no_gpu_could_hold_is_refused_while_no_gpu_worker_is_live(
    client: TestClient,
) -> None:
    runs: RunStore = client.app.state.runs  # type: ignore[attr-defined]

    response = train(client, HUGE)

    assert response.status_code == 422
    detail = response.json()["detail"]
    assert "of GPU memory" in detail and "TRAINCTL_MAX_GPU_MEMORY_BYTES" in detail
    assert f"{LARGEST_GPU_MEMORY_BYTES / 2**30:,.1f} GiB" in detail
    assert runs.list_runs()[0] == []


@pytest.mark.parametrize("kind", ["benchmark", "validate"])
def test_every_kind_with_an_estimate_is_held_to_the_ceiling(client: TestClient, kind: str) -> None:
    ckpts: CheckpointStore = client.app.state.checkpoints  # type: ignore[attr-defined]
    save_checkpoint(ckpts, "exp", step=10, model_config=get_preset("base").to_dict())
    body: dict[str, Any] = {"device": "cuda", "checkpoint": "exp/step_10"}
    body |= {"batch_size": 4096, "seq_len": 4096}
    if kind == "benchmark":
        body = {"device": "cuda", "steps": 1, **HUGE}

    response = client.post(f"/runs/{kind}", json=body)

    assert response.status_code == 422, response.text
    assert "TRAINCTL_MAX_GPU_MEMORY_BYTES" in response.json()["detail"]


def test_a_cuda_run_that_fits_waits_for_a_gpu_worker(client: TestClient) -> None:
    response = train(client, SMALL)

    assert response.status_code == 202
    assert "GPU" in (response.json()["waiting_reason"] or "")


def test_the_ceiling_is_a_setting(tmp_path: Path) -> None:
    for client in service(tmp_path, max_gpu_memory_bytes=1 << 30):
        response = train(client, SMALL)

        assert response.status_code == 422
        assert "any GPU has (TRAINCTL_MAX_GPU_MEMORY_BYTES" in response.json()["detail"]


def test_a_live_gpu_workers_memory_is_the_limit_and_a_nonsense_report_is_ignored(
    client: TestClient,
) -> None:
    runs: RunStore = client.app.state.runs  # type: ignore[attr-defined]
    info = {"memory_bytes": 2 << 30, "gpus": ["small"]}
    runs.workers.register("g1", host="n1", pid=1, device="cuda", info=info, gpus=1)
    runs.workers.register(
        "g2", host="n2", pid=2, device="cuda", info={"memory_bytes": True}, gpus=1
    )

    refused = train(client, {"model": {"preset": "small"}, "batch": {"micro_batch_size": 64}})

    assert refused.status_code == 422
    assert "more than the largest worker has: 2.0 GiB" in refused.json()["detail"]

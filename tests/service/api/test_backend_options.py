"""A run's `slurm` options mean something only to the Slurm backend (service/submit.py): on a
service whose workers claim from the queue they are a 422 that says which setting they need,
and nothing is queued. The Slurm backend's own checks: tests/e2e/test_slurm_backend.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from trainctl.service.app import create_app
from trainctl.service.settings import Settings

BODY = {"experiment": "e", "steps": 5, "device": "cpu", "data": {"source": "synthetic"}}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(Settings(data_dir=tmp_path, workers=0))
    with TestClient(app, base_url="http://localhost") as client:
        yield client


@pytest.mark.parametrize("kind", ["train", "benchmark"])
def test_slurm_options_on_a_local_service_are_a_422_naming_the_setting(
    client: TestClient, kind: str
) -> None:
    body = BODY if kind == "train" else {"steps": 5, "device": "cpu"}
    r = client.post(f"/runs/{kind}", json={**body, "slurm": {"partition": "gpu"}})
    assert r.status_code == 422, r.text
    assert "TRAINCTL_BACKEND=slurm" in r.text
    assert client.get("/runs").json()["items"] == []


def test_a_bad_slurm_setting_stops_the_service_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="time_limit"):
        Settings(data_dir=tmp_path, backend="slurm", slurm_time_limit="tomorrow")
    with pytest.raises(ValueError, match="slurm_partition"):
        Settings(data_dir=tmp_path, backend="slurm", slurm_partition="gpu;id")

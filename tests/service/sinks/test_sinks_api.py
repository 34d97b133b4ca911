"""Naming trackers: a train request's `trackers` and `tensorboard_dir`, the service's
TRAINCTL_TRACKERS and TRAINCTL_MLFLOW_URI, and what is refused at submit."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from trainctl.service.app import create_app
from trainctl.service.settings import Settings

CPU_TRAIN = {"experiment": "exp", "steps": 10, "device": "cpu"}


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    (tmp_path / "roots" / "boards").mkdir(parents=True)
    return tmp_path / "roots"


def serve(tmp_path: Path, **settings: Any) -> TestClient:
    return TestClient(create_app(Settings(data_dir=tmp_path, workers=0, **settings)),
                      base_url="http://localhost")  # fmt: skip


@pytest.fixture
def client(tmp_path: Path, roots: Path) -> Iterator[TestClient]:
    with serve(tmp_path, data_roots=[roots]) as test_client:
        yield test_client


def submit(client: TestClient, **body: Any) -> Any:
    return client.post("/runs/train", json=CPU_TRAIN | body)


def test_mlflow_without_a_tracking_server_is_refused_naming_the_setting(
    client: TestClient,
) -> None:
    response = submit(client, trackers=["tensorboard", "mlflow"])

    assert response.status_code == 422
    assert "set TRAINCTL_MLFLOW_URI" in response.json()["detail"]


def test_the_plan_names_the_trackers_asked_for(tmp_path: Path) -> None:
    with serve(tmp_path, mlflow_uri="http://127.0.0.1:5000") as client:
        response = submit(client, trackers=["mlflow", "tensorboard"])

    assert response.status_code == 202
    assert response.json()["spec"]["trackers"] == ["mlflow", "tensorboard"]
    assert response.json()["spec"]["tensorboard_dir"] is None  # the data dir's tensorboard/


def test_the_services_trackers_are_the_default_and_an_empty_list_opts_out(
    tmp_path: Path,
) -> None:
    with serve(tmp_path, trackers=["tensorboard"]) as client:
        default = submit(client).json()
        none = submit(client, experiment="other", trackers=[]).json()

    assert default["spec"]["trackers"] == ["tensorboard"]
    assert none["spec"]["trackers"] == []


def test_a_tensorboard_dir_inside_the_data_roots_is_pinned_to_its_real_path(
    client: TestClient, roots: Path
) -> None:
    response = submit(client, trackers=["tensorboard"], tensorboard_dir="boards")

    assert response.status_code == 202
    assert response.json()["spec"]["tensorboard_dir"] == os.path.realpath(roots / "boards")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"trackers": ["tensorboard"], "tensorboard_dir": "/"}, "outside the data roots"),
        ({"trackers": ["tensorboard"], "tensorboard_dir": "missing"}, "does not exist"),
        ({"trackers": [], "tensorboard_dir": "boards"}, "has no 'tensorboard' tracker"),
        ({"trackers": ["tensorboard", "tensorboard"]}, "name each tracker once"),
        ({"trackers": ["neptune"]}, "Input should be 'tensorboard', 'mlflow' or 'wandb'"),
    ],
)
def test_bad_trackers_are_refused_at_submit(
    client: TestClient, body: dict[str, Any], expected: str
) -> None:
    response = submit(client, **body)

    assert response.status_code == 422
    assert expected in response.json()["detail"]


def test_the_service_refuses_to_start_with_mlflow_and_no_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRAINCTL_TRACKERS", "tensorboard, MLflow")
    monkeypatch.delenv("TRAINCTL_MLFLOW_URI", raising=False)
    with pytest.raises(ValidationError, match="TRAINCTL_MLFLOW_URI is not set"):
        Settings()

    monkeypatch.setenv("TRAINCTL_MLFLOW_URI", "http://mlflow.lab:5000")
    assert Settings().trackers == ["tensorboard", "mlflow"]


@pytest.mark.parametrize("uri", ["file:///tmp/mlruns", "databricks", "mlflow.lab:5000"])
def test_the_mlflow_uri_is_an_http_url(uri: str) -> None:
    with pytest.raises(ValidationError, match="must be an http or https URL"):
        Settings(mlflow_uri=uri)

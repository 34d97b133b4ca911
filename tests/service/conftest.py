"""Fixtures: the app on a temporary data dir with no worker processes, and its stores; what a
worker would write into them is tests/service/fakes.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.runs import RunStore


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

"""Fixtures: the app served for real by uvicorn (tests/service/serving.py), a client of it, and
its stores, for the SDK's clients to talk to over real connections."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI

from tests.service.serving import serve
from trainctl.service.app import create_app
from trainctl.service.sdk.client import TrainctlClient
from trainctl.service.settings import Settings
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.runs import RunStore


@pytest.fixture
def server_app(tmp_path: Path) -> Iterator[FastAPI]:
    """The app served by uvicorn (`serve`) until the test ends; its URL is state.base_url."""
    app = create_app(Settings(data_dir=tmp_path, workers=0))
    with serve(app) as url:
        app.state.base_url = url
        yield app


@pytest.fixture
def api(server_app: FastAPI) -> Iterator[TrainctlClient]:
    """A sync client of the server itself (no proxy between): for what a test sets up too."""
    with TrainctlClient(server_app.state.base_url, timeout=10) as client:
        yield client


@pytest.fixture
def runs(server_app: FastAPI) -> RunStore:
    store: RunStore = server_app.state.runs
    return store


@pytest.fixture
def ckpts(server_app: FastAPI) -> CheckpointStore:
    store: CheckpointStore = server_app.state.checkpoints
    return store

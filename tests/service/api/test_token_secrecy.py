"""The API token guards every endpoint but /healthz and never reaches a log."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from trainctl.service.app import create_app
from trainctl.service.settings import Settings

TOKEN = "s3cret-token-value-0123456789"


def test_the_token_never_appears_in_any_log_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    app = create_app(Settings(data_dir=tmp_path, workers=0, api_token=TOKEN))
    with TestClient(app, base_url="http://localhost") as client:
        good = {"Authorization": f"Bearer {TOKEN}"}
        bad = {"Authorization": f"Bearer {TOKEN}x"}
        assert client.get("/runs", headers=good).status_code == 200
        denied = client.get("/runs", headers=bad)
        assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer"
        assert client.post("/runs/benchmark", json={"steps": 0}, headers=good).status_code == 422
        assert client.get("/healthz").status_code == 200
    assert caplog.records  # something was logged, and none of it holds the token
    assert TOKEN not in caplog.text

"""Workers, liveness, readiness, the bearer token, and `python -m trainctl.service`'s host check."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr

from tests.support.polling import poll
from tests.support.ports import free_port
from tests.support.service_process import Service
from trainctl.service.__main__ import main
from trainctl.service.app import create_app
from trainctl.service.deps import get_runs
from trainctl.service.settings import Settings, get_settings, is_loopback
from trainctl.store.db.runs import RunStore

TOKEN = "s3cret-token"


def test_healthz_says_ok(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


def test_readyz_reports_the_database_and_live_workers(client: TestClient, runs: RunStore) -> None:
    runs.workers.register("w1", host="h", pid=1, device="cpu", info={})

    response = client.get("/readyz")

    assert response.status_code == 200
    assert response.json() == {"status": "ready", "database": "ok", "workers_alive": 1}


def test_readyz_is_503_when_the_database_cannot_be_queried(
    app: FastAPI, client: TestClient, tmp_path: Path
) -> None:
    broken = RunStore(f"sqlite:///{tmp_path}/missing-folder/runs.db")
    app.dependency_overrides[get_runs] = lambda: broken
    try:
        response = client.get("/readyz")
    finally:
        broken.close()

    assert response.status_code == 503
    assert "database" in response.json()["detail"]


@pytest.mark.slow
def test_workers_are_listed_with_whether_they_are_alive(
    client: TestClient, runs: RunStore, settings: Settings
) -> None:
    runs.workers.register(
        "w1", host="node1", pid=42, device="cuda", info={"gpu": "H100"},
        model_plugins=["tiny_mlp"], hf_model_types=["qwen3", "llama"],
    )  # fmt: skip
    runs.workers.register("w2", host="node2", pid=43, device="cpu", info={})  # no types

    items = client.get("/workers").json()["items"]

    assert [(w["id"], w["device"], w["pid"], w["alive"]) for w in items] == [
        ("w1", "cuda", 42, True),
        ("w2", "cpu", 43, True),
    ]
    assert items[0]["current_run_id"] is None
    # What each one builds, as GET /models combines them.
    assert items[0]["model_plugins"] == ["tiny_mlp"]
    assert items[0]["hf_model_types"] == ["llama", "qwen3"]
    assert items[1]["hf_model_types"] == []


# --- auth -----------------------------------------------------------------------------------


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path, workers=0, api_token=SecretStr(TOKEN))
    with TestClient(create_app(settings), base_url="http://localhost") as test_client:
        yield test_client


@pytest.mark.slow
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {TOKEN}", "Bearer "])
@pytest.mark.parametrize("path", ["/runs", "/checkpoints", "/workers", "/readyz"])
def test_without_the_right_token_every_endpoint_is_401(
    locked: TestClient, path: str, authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization else {}

    response = locked.get(path, headers=headers)

    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert TOKEN not in response.text


def test_submitting_without_the_token_is_401_not_a_validation_error(locked: TestClient) -> None:
    response = locked.post("/runs/train", json={"steps": 0})

    assert response.status_code == 401


def test_with_the_token_endpoints_answer(locked: TestClient) -> None:
    response = locked.get("/runs", headers={"Authorization": f"Bearer {TOKEN}"})

    assert response.status_code == 200


def test_healthz_needs_no_token(locked: TestClient) -> None:
    assert locked.get("/healthz").status_code == 200


# --- python -m trainctl.service -------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("::1", True), ("localhost", True), ("127.8.0.1", True),
     ("0.0.0.0", False), ("10.0.0.5", False), ("example.org", False)],
)  # fmt: skip
def test_loopback_hosts_are_recognised(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_serving_beyond_loopback_without_a_token_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TRAINCTL_API_TOKEN", raising=False)
    get_settings.cache_clear()

    code = main(["--host", "0.0.0.0"])
    get_settings.cache_clear()

    assert code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "TRAINCTL_API_TOKEN" in err and "--insecure" in err


@pytest.mark.slow
@pytest.mark.parametrize("token", ["", "  \t"])
def test_serving_beyond_loopback_with_an_empty_or_blank_token_is_refused(
    tmp_path: Path, token: str
) -> None:
    # `TRAINCTL_API_TOKEN=` would otherwise start a public service that answers 401 to all.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINCTL_")}
    env.update(TRAINCTL_API_TOKEN=token, TRAINCTL_DATA_DIR=str(tmp_path), TRAINCTL_WORKERS="0")

    # A service that started would outlive the timeout, and the test fail on it.
    done = subprocess.run(
        [sys.executable, "-m", "trainctl.service", "--host", "0.0.0.0", "--port", str(free_port())],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "TRAINCTL_API_TOKEN" in done.stderr and "blank" in done.stderr


@pytest.mark.slow
def test_a_client_following_a_run_does_not_hold_up_the_services_stop(tmp_path: Path) -> None:
    # uvicorn waits for open responses on SIGTERM, and the event stream of a queued run never
    # ends: unbounded, that wait would outlast Docker's stop_grace_period, and the SIGKILL
    # after it would cut the workers' checkpoints short.
    service = Service(tmp_path, workers=0).start()
    run_id = httpx.post(f"{service.url}/runs/train", json={"steps": 10}).json()["id"]
    with httpx.stream("GET", f"{service.url}/runs/{run_id}/events", timeout=30) as events:
        assert events.status_code == 200  # the headers came: the stream is open

        assert service.stop(timeout=30)


def test_the_app_creates_a_missing_data_dir_at_startup(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "fresh" / "data", workers=0)

    with TestClient(create_app(settings), base_url="http://localhost") as fresh:
        assert fresh.get("/readyz").status_code == 200

    assert (settings.data_dir / "trainctl.db").is_file()


@pytest.mark.slow
def test_local_workers_run_niced_so_training_yields_the_cpu_to_the_api(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, workers=1, worker_nice=7)
    own = os.getpriority(os.PRIO_PROCESS, 0)
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        supervisor = client.app.state.supervisor  # type: ignore[attr-defined]
        pid = supervisor.slots[0].process.pid
        # The worker renices itself first thing; the API process keeps its own niceness.
        poll(lambda: os.getpriority(os.PRIO_PROCESS, pid) == own + 7, what="a niced worker")
        assert os.getpriority(os.PRIO_PROCESS, 0) == own

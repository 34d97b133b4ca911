"""The httpx client against a real uvicorn server (a thread, a free port)."""

from __future__ import annotations

import hashlib
import socket
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import uvicorn
from fastapi import FastAPI

from service.app import create_app
from service.async_client import AsyncTrainctlClient
from service.client import ApiError, DownloadError, TrainctlClient
from service.settings import Settings
from store.checkpoints import MODEL_FILE, CheckpointStore
from store.runs import RunStore
from tests.service.conftest import save_checkpoint

CPU_TRAIN = {"experiment": "exp", "steps": 20, "device": "cpu"}


@pytest.fixture
def server_app(tmp_path: Path) -> Iterator[FastAPI]:
    """The app served by uvicorn on 127.0.0.1 and a free port, until the test ends."""
    app = create_app(Settings(data_dir=tmp_path, workers=0))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    app.state.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield app
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture
def api(server_app: FastAPI) -> Iterator[TrainctlClient]:
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


def test_submit_get_and_list_round_trip(api: TrainctlClient) -> None:
    run = api.submit_train(**CPU_TRAIN)
    bench = api.submit("benchmark", {"steps": 1, "device": "cpu"}, idempotency_key="b1")
    replay = api.submit("benchmark", {"steps": 1, "device": "cpu"}, idempotency_key="b1")

    assert api.get_run(run.id) == run
    assert replay.id == bench.id
    assert [r.id for r in api.list_runs(kind="train").items] == [run.id]
    assert [r.id for r in api.iter_runs(limit=1)] == [bench.id, run.id]
    assert api.health().status == "ok"
    assert api.workers() == []


def test_errors_raise_api_error_with_the_servers_detail(api: TrainctlClient) -> None:
    with pytest.raises(ApiError) as missing:
        api.get_run("nope")
    with pytest.raises(ApiError) as invalid:
        api.submit_train(steps=0)

    assert missing.value.status_code == 404
    assert "run 'nope' does not exist" in str(missing.value)
    assert invalid.value.status_code == 422
    assert "body.steps" in invalid.value.detail


def test_events_follow_the_run_to_its_end_and_resume(api: TrainctlClient, runs: RunStore) -> None:
    run = api.submit_train(**CPU_TRAIN)
    first = runs.append_event(run.id, "log", {"level": "info", "message": "one"})
    runs.append_event(run.id, "metrics", {"kind": "train", "step": 1, "loss": 4.2})
    claimed = runs.claim("w", lease_seconds=60)
    assert claimed is not None
    runs.finish(run.id, "w", claimed.attempt, "succeeded", result={"loss": 4.2})

    events = list(api.events(run.id))
    resumed = list(api.events(run.id, last_event_id=first))

    assert [e.type for e in events] == ["log", "metrics", "state", "state"]
    assert resumed == events[1:]
    assert api.metrics(run.id, kind="train")[0].model_extra == {"step": 1, "loss": 4.2}
    assert api.logs(run.id)[0].message == "one"
    assert api.wait(run.id, timeout=5).result == {"loss": 4.2}


def test_cancel_then_wait_returns_the_cancelled_run(api: TrainctlClient) -> None:
    run = api.submit_train(**CPU_TRAIN)

    api.cancel_run(run.id)

    assert api.wait(run.id, timeout=5).state == "cancelled"


def test_wait_times_out_on_a_run_that_does_not_finish(api: TrainctlClient) -> None:
    run = api.submit_train(**CPU_TRAIN)

    with pytest.raises(TimeoutError, match="still queued"):
        api.wait(run.id, timeout=0.3, poll=0.05)


def test_downloads_land_on_disk_verified(
    api: TrainctlClient, ckpts: CheckpointStore, tmp_path: Path
) -> None:
    save_checkpoint(ckpts, "exp", step=10, weights=b"w" * 300_000)
    entry = next(f for f in api.get_checkpoint("exp", "step_10").files if f.name == MODEL_FILE)

    file = api.download_file("exp", "step_10", MODEL_FILE, tmp_path)
    archive = api.download_archive("exp", "step_10", tmp_path)

    assert file == tmp_path / MODEL_FILE
    assert hashlib.sha256(file.read_bytes()).hexdigest() == entry.sha256
    with tarfile.open(archive) as tar:
        assert f"step_10/{MODEL_FILE}" in tar.getnames()
    assert api.latest_checkpoint("exp").tag == "step_10"
    assert [c.tag for c in api.list_checkpoints()] == ["step_10"]


def test_a_download_that_does_not_match_the_manifest_raises_and_leaves_no_file(
    api: TrainctlClient, ckpts: CheckpointStore, tmp_path: Path
) -> None:
    folder = save_checkpoint(ckpts, "exp", step=10, weights=b"a" * 1000)
    (folder / MODEL_FILE).write_bytes(b"b" * 1000)  # bit rot: same size, other bytes

    with pytest.raises(DownloadError, match="does not match the manifest"):
        api.download_file("exp", "step_10", MODEL_FILE, tmp_path / "model.bin")

    assert list(tmp_path.glob("model*")) == []


def test_delete_and_prune_through_the_client(api: TrainctlClient, ckpts: CheckpointStore) -> None:
    for step in (10, 20, 30):
        save_checkpoint(ckpts, "exp", step=step)

    dry = api.prune("exp", keep_last=1, dry_run=True)
    deleted = api.delete_checkpoint("exp", "step_10")

    assert [c.tag for c in dry.deleted] == ["step_20", "step_10"]
    assert deleted.tag == "step_10"
    assert [c.tag for c in api.prune("exp", keep_last=1).deleted] == ["step_20"]
    with pytest.raises(ApiError) as gone:
        api.best_checkpoint("exp")
    assert gone.value.status_code == 404


def test_an_interrupted_download_resumes_from_its_part_file(
    api: TrainctlClient, ckpts: CheckpointStore, tmp_path: Path
) -> None:
    weights = bytes(range(256)) * 2000
    save_checkpoint(ckpts, "exp", step=10, weights=weights)
    (tmp_path / "model.bin.part").write_bytes(weights[:100_000])  # what a dropped link left
    seen: list[tuple[int, int | None]] = []

    file = api.download_file(
        "exp", "step_10", MODEL_FILE, tmp_path / "model.bin", on_progress=lambda *p: seen.append(p)
    )

    assert file.read_bytes() == weights
    assert seen[0] == (100_000, len(weights))  # started from the bytes on disk
    assert not (tmp_path / "model.bin.part").exists()


def test_a_part_file_with_wrong_bytes_fails_verification_and_is_removed(
    api: TrainctlClient, ckpts: CheckpointStore, tmp_path: Path
) -> None:
    save_checkpoint(ckpts, "exp", step=10, weights=b"a" * 10_000)
    (tmp_path / "model.bin.part").write_bytes(b"b" * 5_000)

    with pytest.raises(DownloadError, match="does not match the manifest"):
        api.download_file("exp", "step_10", MODEL_FILE, tmp_path / "model.bin")

    assert list(tmp_path.glob("model.bin*")) == []
    assert api.download_file("exp", "step_10", MODEL_FILE, tmp_path / "model.bin").exists()


def test_the_async_client_submits_iterates_and_follows_events(
    server_app: FastAPI, runs: RunStore
) -> None:
    async def scenario() -> tuple[list[str], list[str], str]:
        async with AsyncTrainctlClient(server_app.state.base_url, timeout=10) as api:
            first = await api.submit("train", CPU_TRAIN)
            second = await api.submit("benchmark", {"steps": 1, "device": "cpu"})
            listed = [r.id async for r in api.iter_runs(limit=1)]
            await api.cancel_run(first.id)
            types = [e.type async for e in api.events(first.id)]
            done = await api.wait(first.id, timeout=5)
            return listed, [second.id, first.id, *types], done.state

    listed, expected, state = anyio.run(scenario)

    assert listed == expected[:2]
    assert expected[2:] == ["state"]  # queued -> cancelled
    assert state == "cancelled"


def test_the_client_reads_its_url_and_token_from_the_environment(
    server_app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINCTL_URL", server_app.state.base_url)
    monkeypatch.setenv("TRAINCTL_API_TOKEN", "s3cret")

    with TrainctlClient() as api:
        assert api.base_url.rstrip("/") == server_app.state.base_url
        assert api._http.headers["Authorization"] == "Bearer s3cret"

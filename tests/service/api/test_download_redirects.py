"""Checkpoints and exports in a bucket through the API (docs/operations.md, "Checkpoints in a
bucket"): downloads answered by a redirect to a presigned URL (TRAINCTL_DOWNLOADS=redirect),
the app served by uvicorn on a real S3 server, followed by the real `curl -L` and by the SDK,
neither taking the bearer token to the bucket's host; an export request for a checkpoint whose
export is in the bucket is refused at submit."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient

from tests.service.cli.invoke import trainctl
from tests.service.fakes import save_checkpoint
from tests.service.serving import serve
from tests.support.s3server import S3Server
from trainctl.service.app import create_app
from trainctl.service.sdk.async_client import AsyncTrainctlClient
from trainctl.service.sdk.client import TrainctlClient
from trainctl.service.settings import Settings
from trainctl.store.checkpoints.manifests import MANIFEST_FILE, MODEL_FILE
from trainctl.store.checkpoints.store import CheckpointStore

TOKEN = "redirect-test-token-0123456789"
WEIGHTS = os.urandom(3 * 1024 * 1024 + 17)


@dataclass
class Service:
    url: str
    checkpoints: CheckpointStore
    exports: CheckpointStore


@pytest.fixture
def service(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Service]:
    """The service on a bucket of its own, downloads by redirect, a token required; exp's
    step_10 saved as a checkpoint and as an export."""
    for name, value in s3_server.environ().items():
        monkeypatch.setenv(name, value)
    settings = Settings(
        data_dir=tmp_path, workers=0, storage_url=f"s3://{s3_server.new_bucket()}/node",
        downloads="redirect", download_url_seconds=60, api_token=TOKEN,
    )  # fmt: skip
    app = create_app(settings)
    with serve(app) as url:
        found = Service(url, app.state.checkpoints, app.state.exports)
        for store in (found.checkpoints, found.exports):
            save_checkpoint(store, "exp", step=10, weights=WEIGHTS)
        yield found


class Recording(httpx.HTTPTransport):
    """The real transport, noting each request's port and whether it carried a token."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[int | None, bool]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.url.port, "authorization" in request.headers))
        return super().handle_request(request)


def listed_sha256(store: CheckpointStore, name: str) -> str:
    return str(next(f["sha256"] for f in store.get("exp", "step_10").files if f["name"] == name))


def port_of(url: str) -> int | None:
    return httpx.URL(url).port


@pytest.mark.parametrize("kind", ["checkpoints", "exports"])
def test_the_sdk_follows_the_redirect_without_its_token(
    service: Service, tmp_path: Path, kind: str
) -> None:
    transport = Recording()
    with TrainctlClient(service.url, TOKEN, transport=transport) as api:
        download = api.download_file if kind == "checkpoints" else api.download_export_file
        path = download("exp", "step_10", MODEL_FILE, tmp_path)

    assert path.read_bytes() == WEIGHTS
    store = service.checkpoints if kind == "checkpoints" else service.exports
    assert hashlib.sha256(path.read_bytes()).hexdigest() == listed_sha256(store, MODEL_FILE)
    service_port = port_of(service.url)
    assert transport.sent[-2:] == [(service_port, True), (transport.sent[-1][0], False)]
    assert transport.sent[-1][0] != service_port  # the file came from the bucket


class AsyncRecording(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[int | None, bool]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.url.port, "authorization" in request.headers))
        return await super().handle_async_request(request)


def test_the_async_sdk_follows_the_redirect_without_its_token(
    service: Service, tmp_path: Path
) -> None:
    transport = AsyncRecording()

    async def main() -> Path:
        async with AsyncTrainctlClient(service.url, TOKEN, transport=transport) as api:
            return await api.download_file("exp", "step_10", MODEL_FILE, tmp_path)

    assert anyio.run(main).read_bytes() == WEIGHTS
    assert [has_token for _, has_token in transport.sent[-2:]] == [True, False]
    assert transport.sent[-1][0] != port_of(service.url)


def test_the_cli_downloads_a_checkpoint_from_the_bucket(service: Service, tmp_path: Path) -> None:
    """Every file: the manifest streamed by the service, the others by redirect."""
    out = tmp_path / "out"
    code, _, err = trainctl(
        service, "checkpoints", "download", "exp", "step_10", "-o", out,
        env={"TRAINCTL_API_TOKEN": TOKEN},
    )  # fmt: skip

    assert code == 0, err
    assert (out / MODEL_FILE).read_bytes() == WEIGHTS
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f["name"] for f in service.checkpoints.get("exp", "step_10").files] + [MANIFEST_FILE]
    )


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl binary")
def test_curl_follows_the_redirect_without_the_token(service: Service, tmp_path: Path) -> None:
    out = tmp_path / "model.safetensors"
    done = subprocess.run(
        ["curl", "-sS", "-v", "-L", "--fail", "-H", f"Authorization: Bearer {TOKEN}",
         "-o", str(out), f"{service.url}/checkpoints/exp/step_10/files/{MODEL_FILE}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == WEIGHTS
    sha = hashlib.sha256(out.read_bytes()).hexdigest()
    assert sha == listed_sha256(service.checkpoints, MODEL_FILE)
    # curl -v prints each request's headers as "> Name: value" lines, a request per "> GET".
    requests = [block for block in done.stderr.split("> GET ")[1:]]
    assert len(requests) == 2, done.stderr
    assert f"Bearer {TOKEN}" in requests[0]
    assert "authorization" not in requests[1].lower(), requests[1]


def test_a_redirect_names_the_save_of_the_manifest_and_whole_checkpoints_still_stream(
    service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)  # the service's level (botocore's DEBUG prints signatures)
    base = f"{service.url}/checkpoints/exp/step_10"
    with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        moved = http.get(f"{base}/files/{MODEL_FILE}")
        assert moved.status_code == 307
        assert moved.headers["cache-control"] == "no-store"
        assert moved.headers["etag"] == f'"{listed_sha256(service.checkpoints, MODEL_FILE)}"'
        unchanged = http.get(
            f"{base}/files/{MODEL_FILE}", headers={"If-None-Match": moved.headers["etag"]}
        )
        assert unchanged.status_code == 304
        # What cannot be one object of the bucket is served by the service itself.
        assert http.get(f"{base}/files/{MANIFEST_FILE}").status_code == 200
        assert http.get(f"{base}/archive").status_code == 200

        # A replace of the tag removes the save the URL names: the URL then fails, and never
        # serves the new save's bytes in place of the ones it was given for.
        save_checkpoint(service.checkpoints, "exp", step=10, weights=b"other weights")
        assert httpx.get(moved.headers["location"]).status_code == 404
    # The URL is a credential until it expires: in the answer only, in no log line of the
    # service (the access log's included). This test's own httpx logs each URL it requests.
    signature = httpx.URL(moved.headers["location"]).params["X-Amz-Signature"]
    logged = [r.getMessage() for r in caplog.records if r.name != "httpx"]
    assert any("307" in line for line in logged)  # the access log line is there
    assert not any(signature in line for line in logged)


def test_a_storage_that_cannot_redirect_streams(tmp_path: Path) -> None:
    """On local disk `Storage.url` is None: TRAINCTL_DOWNLOADS=redirect changes nothing."""
    app = create_app(Settings(data_dir=tmp_path, workers=0, downloads="redirect"))
    with TestClient(app, base_url="http://localhost") as client:
        save_checkpoint(app.state.checkpoints, "exp", step=10, weights=WEIGHTS)
        got = client.get(f"/checkpoints/exp/step_10/files/{MODEL_FILE}")

    assert got.status_code == 200 and got.content == WEIGHTS


def test_an_export_already_in_the_bucket_is_refused_at_submit(service: Service) -> None:
    """Where an export goes is the exports store's question, not a local folder's."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    save_checkpoint(service.checkpoints, "exp", step=20)
    again = httpx.post(f"{service.url}/runs/export", json={"checkpoint": "exp/step_10"},
                       headers=auth)  # fmt: skip
    fresh = httpx.post(f"{service.url}/runs/export", json={"checkpoint": "exp/step_20"},
                       headers=auth)  # fmt: skip

    assert again.status_code == 409 and "already exported" in again.json()["detail"]
    assert fresh.status_code == 202, fresh.text
    assert httpx.get(f"{service.url}/runs/{fresh.json()['id']}", headers=auth).json()["spec"][
        "output"
    ] == service.exports.describe("exp", "step_20")

"""A frozen bucket is the service's outage for the routes that need it, and theirs only
(docs/design/checkpoints.md, "Object storage"; service/limits.py): with the S3 server stopped
(SIGSTOP) for longer than any answer may take, each request to the bucket gives up within a
few seconds as a 503 naming the bucket, and the requests that need no bucket answer meanwhile,
however many bucket requests are waiting. The real service, over HTTP, with its own server:
the session's is never frozen."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.s3server import S3Server, running_s3_server
from tests.support.service_process import Service
from tests.support.stores import s3_store
from trainctl.store.checkpoints.manifests import METADATA_FILE, MODEL_FILE

BOUND_SECONDS = 20.0
"""Generous beside the few seconds a bucket request is given (store/checkpoints/s3.py,
`SERVICE_TIMEOUTS`), and well under the freeze: a request that waited for the bucket to
thaw would take all of it."""
FREEZE_SECONDS = 60.0


@contextmanager
def frozen(server: S3Server) -> Iterator[None]:
    """The server stopped (SIGSTOP) for the block, and always thawed after it."""
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


@pytest.fixture
def bucket_service(tmp_path: Path) -> Iterator[tuple[Service, S3Server, str]]:
    (tmp_path / "s3").mkdir()
    (tmp_path / "data").mkdir()
    with running_s3_server(tmp_path / "s3") as server:
        bucket = server.new_bucket()
        store = s3_store(server, bucket, tmp_path / "cache", "node/checkpoints")
        with store.stage("exp", "step_1") as staged:
            staged.write(MODEL_FILE, b"weights")
            staged.write(METADATA_FILE, b'{"step": 1, "run_id": "run-1"}')
            staged.commit()
        env = {**server.environ(), "TRAINCTL_STORAGE_URL": f"s3://{bucket}/node"}
        service = Service(tmp_path / "data", workers=0, extra_env=env).start()
        try:
            yield service, server, bucket
        finally:
            service.stop()


BUCKET_REQUESTS = [
    ("GET", "/checkpoints", None),
    ("GET", "/checkpoints/exp/step_1", None),
    ("GET", f"/checkpoints/exp/step_1/files/{MODEL_FILE}", None),
    ("GET", "/exports", None),
    ("POST", "/runs/validate", {"checkpoint": "exp/step_1", "device": "cpu"}),
]


def timed(
    client: httpx.Client, method: str, path: str, body: object
) -> tuple[float, httpx.Response]:
    start = time.monotonic()
    response = client.request(method, path, json=body)
    return time.monotonic() - start, response


def test_a_frozen_bucket_is_a_prompt_503_naming_it_and_never_starves_other_routes(
    bucket_service: tuple[Service, S3Server, str],
) -> None:
    service, server, bucket = bucket_service
    with httpx.Client(base_url=service.url, timeout=FREEZE_SECONDS + 30) as client:
        assert client.get("/checkpoints").json()["items"][0]["tag"] == "step_1"
        with frozen(server), ThreadPoolExecutor(64) as pool:
            frozen_at = time.monotonic()
            singles = [pool.submit(timed, client, *request) for request in BUCKET_REQUESTS]
            for (_, path, _), done in zip(BUCKET_REQUESTS, singles, strict=True):
                took, response = done.result()
                assert response.status_code == 503, (path, response.text)
                assert bucket in response.json()["detail"], (path, response.text)
                assert took < BOUND_SECONDS, (path, took)

            # 45 submits that need the bucket at once, and meanwhile what needs none
            flood = [pool.submit(timed, client, *BUCKET_REQUESTS[-1]) for _ in range(45)]
            time.sleep(1)  # let them take every slot there is
            for path in ["/runs", "/workers", "/readyz", "/healthz"]:
                took, response = timed(client, "GET", path, None)
                assert response.status_code == 200, (path, response.text)
                assert took < 5, (path, took)
            for done in flood:
                took, response = done.result()
                assert response.status_code == 503, response.text
                assert took < 2 * BOUND_SECONDS, took
                detail = response.json()["detail"]
                assert bucket in detail or "TRAINCTL_STORE_CONCURRENCY" in detail, detail
            assert time.monotonic() - frozen_at < FREEZE_SECONDS
        assert client.get("/checkpoints").status_code == 200  # thawed, it serves again

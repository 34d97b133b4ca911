"""A checkpoint storage that cannot be reached is the service's outage, not the caller's
mistake: a 503 naming the bucket, with Retry-After, never a bare 500 (service/errors.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.support.s3server import S3Server
from trainctl.service.app import create_app
from trainctl.service.settings import Settings


@pytest.fixture
def bucket_service(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[TestClient, str]]:
    for name, value in s3_server.environ().items():
        monkeypatch.setenv(name, value)
    bucket = s3_server.new_bucket()
    settings = Settings(data_dir=tmp_path, workers=0, storage_url=f"s3://{bucket}/node")
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        yield client, bucket


@pytest.mark.parametrize(
    "path",
    ["/checkpoints", "/checkpoints/latest", "/checkpoints/best", "/checkpoints/exp/step_1"],
)
def test_a_bucket_gone_under_the_service_is_a_503_that_names_it(
    bucket_service: tuple[TestClient, str], s3_server: S3Server, path: str
) -> None:
    client, bucket = bucket_service
    assert client.get("/checkpoints").status_code == 200
    s3_server.client().delete_bucket(Bucket=bucket)

    response = client.get(path)

    assert response.status_code == 503, response.text
    assert bucket in response.json()["detail"]
    assert "AWS_ENDPOINT_URL" in response.json()["detail"]
    assert int(response.headers["Retry-After"]) > 0
    assert client.get("/healthz").status_code == 200


def test_wrong_credentials_are_a_503_that_never_shows_the_secret(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3_server.new_bucket()
    wrong = "w" * 40
    for name, value in s3_server.environ(secret_key=wrong).items():
        monkeypatch.setenv(name, value)
    settings = Settings(data_dir=tmp_path, workers=0, storage_url=f"s3://{bucket}/node")
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        response = client.get("/checkpoints")

    assert response.status_code == 503, response.text
    assert f"bucket {bucket!r} refused" in response.json()["detail"]
    assert wrong not in response.text and s3_server.secret_key not in response.text

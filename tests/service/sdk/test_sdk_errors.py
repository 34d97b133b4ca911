"""Each error status raises its own ApiError subclass, from real answers of a real server."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from fastapi import FastAPI

import trainctl
from tests.service.sdk.clients import CPU_TRAIN
from tests.service.sdk.proxy import Proxy, error_answer
from tests.service.serving import serve
from trainctl.service.app import create_app
from trainctl.service.sdk import steps as sdk_steps
from trainctl.service.sdk.async_client import AsyncTrainctlClient
from trainctl.service.sdk.client import (
    ApiError,
    Conflict,
    InvalidRequest,
    NotFound,
    TrainctlClient,
    Unauthorized,
)
from trainctl.service.settings import Settings


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    """A server that wants the token "s3cret"."""
    app: FastAPI = create_app(Settings(data_dir=tmp_path, workers=0, api_token="s3cret"))
    with serve(app) as base_url:
        yield base_url


@pytest.fixture
def api(url: str) -> Iterator[TrainctlClient]:
    with TrainctlClient(url, token="s3cret", timeout=10) as client:
        yield client


def test_an_unknown_run_raises_not_found(api: TrainctlClient) -> None:
    with pytest.raises(NotFound) as missing:
        api.get_run("nope")

    assert missing.value.status_code == 404
    assert "run 'nope' does not exist" in missing.value.detail


def test_an_idempotency_key_used_for_another_request_raises_conflict(api: TrainctlClient) -> None:
    api.submit("train", CPU_TRAIN, idempotency_key="k1")

    with pytest.raises(Conflict) as clash:
        api.submit("train", {**CPU_TRAIN, "steps": 30}, idempotency_key="k1")

    assert clash.value.status_code == 409
    assert "already used for a different request" in clash.value.detail


def test_a_missing_or_wrong_token_raises_unauthorized(url: str) -> None:
    for token in (None, "wrong"):
        with TrainctlClient(url, token=token, timeout=10) as api, pytest.raises(Unauthorized) as no:
            api.list_runs()

        assert no.value.status_code == 401
        assert "TRAINCTL_API_TOKEN" in no.value.detail


def test_an_invalid_spec_raises_invalid_request(api: TrainctlClient) -> None:
    with pytest.raises(InvalidRequest) as invalid:
        api.submit_train(steps=0)

    assert invalid.value.status_code == 422
    assert "body.steps" in invalid.value.detail


def test_a_400_raises_invalid_request_too() -> None:
    # The SDK always sends JSON the service can read, so the 400 comes from a stand-in.
    unreadable = error_answer(400, "the body cannot be parsed: send JSON encoded as UTF-8")

    with (
        Proxy("http://127.0.0.1:9", then=unreadable) as proxy,
        TrainctlClient(proxy.url) as api,
        pytest.raises(InvalidRequest) as invalid,
    ):
        api.health()

    assert invalid.value.status_code == 400
    assert invalid.value.detail.startswith("the body cannot be parsed")


def test_a_status_without_a_class_of_its_own_raises_api_error() -> None:
    with (
        Proxy("http://127.0.0.1:9", then=error_answer(418, "a teapot")) as proxy,
        TrainctlClient(proxy.url) as api,
        pytest.raises(ApiError) as other,
    ):
        api.health()

    assert type(other.value) is ApiError
    assert (other.value.status_code, other.value.detail) == (418, "a teapot")


def test_the_async_client_raises_the_same_classes(url: str) -> None:
    async def scenario() -> list[type[ApiError]]:
        raised: list[type[ApiError]] = []
        async with AsyncTrainctlClient(url, token="s3cret", timeout=10) as api:
            for attempt in (api.get_run("nope"), api.submit_train(steps=0)):
                with pytest.raises(ApiError) as error:
                    await attempt
                raised.append(type(error.value))
        async with AsyncTrainctlClient(url, token="wrong", timeout=10) as api:
            with pytest.raises(ApiError) as error:
                await api.list_runs()
            raised.append(type(error.value))
        return raised

    assert anyio.run(scenario) == [NotFound, InvalidRequest, Unauthorized]


def test_trainctl_exports_the_clients_and_every_error() -> None:
    assert trainctl.__all__ == sorted(trainctl._EXPORTS)
    assert trainctl.Client is TrainctlClient
    assert trainctl.AsyncClient is AsyncTrainctlClient
    for name in set(trainctl.__all__) - {"Client", "AsyncClient"}:
        assert getattr(trainctl, name) is getattr(sdk_steps, name), name
    for error in (trainctl.NotFound, trainctl.Conflict, trainctl.Unauthorized):
        assert issubclass(error, trainctl.ApiError)
    assert issubclass(trainctl.InvalidRequest, trainctl.ApiError)


def test_the_version_is_the_installed_one_or_says_it_is_unknown() -> None:
    assert trainctl.__version__ == importlib.metadata.version("trainctl")
    assert trainctl._installed_version("trainctl-never-installed") == "0+unknown"

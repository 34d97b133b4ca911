"""Structured logs and request ids: JSON lines off a terminal, an id on every response."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from trainctl.service.logs import configure_logging


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Bug(Exception):
    pass


@pytest.fixture
def buggy_app(app: FastAPI) -> FastAPI:
    """The app with a route that fails as a bug would: an exception no handler maps."""

    def fail() -> None:
        raise Bug("the route broke")

    app.add_api_route("/bug", fail)
    return app


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_client_request_id_is_echoed_and_a_bad_one_replaced(client: TestClient) -> None:
    echoed = client.get("/healthz", headers={"X-Request-ID": "job-42.retry:1"})
    replaced = client.get("/healthz", headers={"X-Request-ID": "two words\tand a tab"})
    missing = client.get("/runs/nope")

    assert echoed.headers["X-Request-ID"] == "job-42.retry:1"
    assert len(replaced.headers["X-Request-ID"]) == 32
    assert len(missing.headers["X-Request-ID"]) == 32 and missing.status_code == 404


def test_access_lines_are_json_with_request_and_run_ids_when_not_a_terminal(
    client: TestClient, restore_logging: None
) -> None:
    out = io.StringIO()
    configure_logging(out)

    client.get("/runs/abc123", headers={"X-Request-ID": "req-1"})

    line = json.loads(out.getvalue().splitlines()[-1])
    assert line["logger"] == "trainctl.http" and line["level"] == "info"
    assert line["request_id"] == "req-1" and line["run_id"] == "abc123"
    assert (line["method"], line["path"], line["status"]) == ("GET", "/runs/abc123", 404)
    assert line["message"].startswith("GET /runs/abc123 404 ")


def test_a_terminal_gets_readable_lines_with_the_ids(restore_logging: None) -> None:
    out = Terminal()
    configure_logging(out)

    logging.getLogger("trainctl.supervisor").warning("requeued", extra={"run_id": "r1"})

    assert out.getvalue().rstrip().endswith("WARNING trainctl.supervisor: requeued [run_id=r1]")


def json_lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.parametrize("given", ["job-42.retry:1", None], ids=["client-id", "no-client-id"])
def test_an_unhandled_error_is_a_500_whose_request_id_finds_its_one_logged_traceback(
    buggy_app: FastAPI, restore_logging: None, given: str | None
) -> None:
    out = io.StringIO()
    configure_logging(out)

    local = "http://localhost"
    with TestClient(buggy_app, raise_server_exceptions=False, base_url=local) as client:
        response = client.get("/bug", headers={"X-Request-ID": given} if given else {})

    request_id = response.headers["X-Request-ID"]
    assert response.status_code == 500
    assert request_id == given or (given is None and len(request_id) == 32)
    assert response.json() == {
        "detail": f"internal error (see the server log); request id {request_id}"
    }
    lines = json_lines(out)
    access = [line for line in lines if line["logger"] == "trainctl.http"]
    tracebacks = [line for line in lines if "exception" in line]
    assert [(line["status"], line["request_id"]) for line in access] == [(500, request_id)]
    assert len(tracebacks) == 1 and tracebacks[0]["request_id"] == request_id
    assert "Bug: the route broke" in tracebacks[0]["exception"]


def test_the_server_does_not_log_a_reraised_traceback_a_second_time(
    buggy_app: FastAPI, restore_logging: None
) -> None:
    out = io.StringIO()
    configure_logging(out)
    with TestClient(buggy_app, base_url="http://localhost") as client, pytest.raises(Bug) as caught:
        # Starlette re-raises the error once its handler has answered.
        client.get("/bug", headers={"X-Request-ID": "req-9"})

    # What uvicorn does with the re-raised error.
    logging.getLogger("uvicorn.error").error("Exception in ASGI application", exc_info=caught.value)

    tracebacks = [line for line in json_lines(out) if "exception" in line]
    assert [line["logger"] for line in tracebacks] == ["trainctl.service"]
    assert tracebacks[0]["request_id"] == "req-9"


def test_a_new_error_is_still_logged_after_another_was(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging(out)
    log = logging.getLogger("trainctl.supervisor")

    for attempt in range(2):
        try:
            raise Bug(f"attempt {attempt}")
        except Bug:
            log.exception("failed")

    assert [line["exception"].splitlines()[-1] for line in json_lines(out)] == [
        "tests.service.api.test_logs.Bug: attempt 0",
        "tests.service.api.test_logs.Bug: attempt 1",
    ]

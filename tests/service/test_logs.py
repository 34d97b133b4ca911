"""Structured logs and request ids: JSON lines off a terminal, an id on every response."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.logs import configure_logging


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


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

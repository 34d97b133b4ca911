"""Issue 23, class 10: every answer carries the security headers, the errors written below
the routes too (413, 416, 404, 405, 400, 500), and even the 400 uvicorn writes for a request
it cannot parse: the headers wrap Starlette's outermost layers (TrainctlApi), and uvicorn's
protocol is ours (`H11WithHeaders`)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from tests.service.fakes import save_checkpoint
from tests.service.serving import serve
from tests.support.service_process import Service
from trainctl.service.app import create_app
from trainctl.service.middleware import SECURITY_HEADERS
from trainctl.service.settings import Settings

MODEL = "/checkpoints/e/step_10/files/model.safetensors"
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[FastAPI, str]]:
    app = create_app(Settings(data_dir=tmp_path, workers=0))

    def fail() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/a-bug", fail)
    with serve(app) as url:
        save_checkpoint(app.state.checkpoints, "e", step=10)
        yield app, url


ERRORS = {
    "413, Content-Length": ("POST", "/runs/train", {"content": b"{" * (2 << 20), "headers": JSON}),
    "413, chunked": ("POST", "/runs/train",
                     {"content": iter([b"[" * (1 << 19)] * 4), "headers": JSON}),
    "416": ("GET", MODEL, {"headers": {"Range": "bytes=99999-"}}),
    "404, no such path": ("GET", "/nope", {}),
    "404, no such static file": ("GET", "/static/nope.js", {}),
    "404, no such checkpoint": ("GET", "/checkpoints/e/step_99", {}),
    "405": ("DELETE", "/healthz", {}),
    "400, a host not served": ("GET", "/runs", {"headers": {"Host": "evil.example"}}),
    "400, a body not UTF-8": ("POST", "/runs/train", {"content": b"\xff", "headers": JSON}),
    "422": ("GET", "/runs", {"params": {"limit": "x"}}),
    "500": ("GET", "/a-bug", {}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(ERRORS))
def test_every_error_carries_the_security_headers_the_request_id_and_json(
    served: tuple[FastAPI, str], case: str
) -> None:
    _, url = served
    method, path, kwargs = ERRORS[case]
    with httpx.Client(base_url=url.replace("127.0.0.1", "localhost")) as http:
        r = http.request(method, path, **kwargs)  # type: ignore[arg-type]

    assert r.status_code == int(case[:3]), r.text
    assert {k: r.headers.get(k) for k in SECURITY_HEADERS} == SECURITY_HEADERS
    assert r.headers.get("X-Request-ID")
    assert r.headers["content-type"] == "application/json"
    assert r.json()["detail"]


def test_the_400_for_a_request_uvicorn_cannot_parse_carries_them_too(tmp_path: Path) -> None:
    service = Service(tmp_path).start(workers=0)
    try:
        with socket.create_connection(("127.0.0.1", service.port), timeout=30) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1 extra words\r\nHost: localhost\r\n\r\n")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
    finally:
        service.stop()
    head, _, body = answer.partition(b"\r\n\r\n")
    fields = [line.decode().split(": ", 1) for line in head.split(b"\r\n")[1:]]
    headers = {name.lower(): value for name, value in fields}

    assert head.startswith(b"HTTP/1.1 400")
    assert {k: headers.get(k.lower()) for k in SECURITY_HEADERS} == SECURITY_HEADERS
    assert b"malformed HTTP/1.1" in body

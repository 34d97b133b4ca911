"""Names and every other pattern, over real HTTP: a final newline names nothing, Windows device
names and a final '.' are no names, and `latest` and `best` are no experiments.

Python's `re` reads `$` as "the end, or before a final newline"; Starlette's route patterns
end in `$`, so `GET .../files/metadata.json%0a` served `metadata.json`. Every path of the app
(generated from its schema, so new ones are covered), every pattern its schema publishes, and
the rules Python code checks with `fullmatch` are tried with a final newline here.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import Field, TypeAdapter, ValidationError
from starlette.requests import Request

from tests.service.api.schema import operations, patterns
from tests.service.fakes import save_checkpoint
from tests.service.serving import serve
from trainctl.service.app import create_app
from trainctl.service.errors import handle_domain_error
from trainctl.service.middleware import VALID_REQUEST_ID
from trainctl.service.routes.runs import CURSOR_PATTERN
from trainctl.service.routing import TEXT_PARAMETER_PATTERN
from trainctl.service.settings import Settings
from trainctl.service.webhooks.targets import check_url
from trainctl.store.checkpoints.manifests import METADATA_FILE
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.names import is_valid_name, parse_step

APP = create_app(Settings(data_dir=Path("/nonexistent"), workers=0))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """The app with a checkpoint, a run, a token and a webhook to name in paths."""
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("data"), workers=0))
    with serve(app) as url, httpx.Client(base_url=url, headers={"Host": "localhost"}) as client:
        save_checkpoint(app.state.checkpoints, "exp", step=10)
        run = client.post("/runs/benchmark", json={"steps": 1, "device": "cpu"}).json()
        client.post(f"/runs/{run['id']}/cancel")  # a finished run: its event stream ends
        client.post("/tokens", json={"name": "reader", "scope": "read"})
        hook = client.post("/webhooks", json={"url": "http://hooks.example/a"}).json()
        values = {"run_id": run["id"], "experiment": "exp", "tag": "step_10"}
        values |= {"webhook_id": str(hook["id"]), "file": METADATA_FILE, "token": "reader"}
        values["worker_id"] = "a-worker"  # none is registered: a drain of it is a 404
        yield url, values


def paths(app: FastAPI) -> Iterator[Any]:
    for method, path, _ in operations(app):
        yield pytest.param(method, path, id=f"{method.upper()} {path}")
    for path in ["/", "/static/dashboard.js", "/docs", "/openapi.json"]:
        yield pytest.param("get", path, id=f"GET {path}")


def filled(path: str, values: dict[str, str]) -> str:
    name = values["file"] if "/files/" in path else values["token"]
    return path.format(**values, name=name)


@pytest.mark.parametrize(("method", "path"), list(paths(APP)))
def test_a_path_with_a_final_newline_names_nothing(
    served: tuple[str, dict[str, str]], method: str, path: str
) -> None:
    url, values = served
    with httpx.Client(base_url=url, headers={"Host": "localhost"}, timeout=30) as client:
        found = client.request("GET", filled(path, values)) if method == "get" else None
        response = client.request(method, filled(path, values) + "%0a")

    assert response.status_code == 404, response.text
    assert response.json()["detail"].startswith("no endpoint matches")
    if found is not None:  # the path itself names an endpoint (which may find nothing there)
        assert found.status_code < 500, found.text
        assert not found.text.startswith('{"detail":"no endpoint matches'), found.text


# A value each published pattern accepts; a pattern the schema gains needs one here.
VALID = {
    r"^[A-Za-z0-9](?:\.?[A-Za-z0-9_-])*$": "exp.v1",
    r"^(?:latest|best|[A-Za-z0-9](?:\.?[A-Za-z0-9_-])*/[A-Za-z0-9](?:\.?[A-Za-z0-9_-])*)$": "e/t",
    r"^[^*?\[\x00-\x1f]+$": "./corpus",
    r"^[^\x00-\x1f]+$": "tensorboard",
    r"^[A-Za-z0-9_-]+$": "WzEsMl0",
    r"^[A-Za-z0-9](?:\.?[A-Za-z0-9_-])*/[A-Za-z0-9](?:\.?[A-Za-z0-9_-])*$": "e/step_4",
    r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$": "gpu-h100",
    r"^[A-Za-z0-9_.&|()\[\]*:,!-]{1,256}$": "h100&ib",
    r"^[A-Za-z0-9_.-]+$": "my-project.v2",
}


def published() -> list[str]:
    """Every pattern but free text's (any text without a NUL: a newline is text there)."""
    found = sorted(set(patterns(APP.openapi())) - {TEXT_PARAMETER_PATTERN})
    url_patterns = [p for p in found if p.startswith("^https?://")]
    return [p for p in found if p not in url_patterns] + url_patterns


@pytest.mark.parametrize("pattern", published())
def test_every_published_pattern_refuses_a_final_newline_where_the_server_checks_it(
    pattern: str,
) -> None:
    """pydantic checks `pattern=` with Rust's regex, whose `$` is the very end."""
    value = "https://hooks.example/a" if pattern.startswith("^https?://") else VALID[pattern]
    checked = TypeAdapter(Annotated[str, Field(pattern=pattern)])

    assert checked.validate_python(value) == value
    for bad in (value + "\n", value + "\n\n", "\n" + value):
        with pytest.raises(ValidationError):
            checked.validate_python(bad)


@pytest.mark.parametrize(
    ("rule", "value"),
    [
        (is_valid_name, "exp"),
        (lambda v: parse_step(v) is not None, "step_7"),
        (lambda v: re.fullmatch(CURSOR_PATTERN, v) is not None, "WzEsMl0"),
        (lambda v: VALID_REQUEST_ID.fullmatch(v) is not None, "req-1"),
        (lambda v: _accepted_url(v), "http://hooks.example/a"),
    ],
    ids=["name", "step-tag", "cursor", "request-id", "webhook-url"],
)
def test_every_rule_python_checks_refuses_a_final_newline(rule: Any, value: str) -> None:
    assert rule(value)
    assert not rule(value + "\n")


def _accepted_url(url: str) -> bool:
    try:
        check_url(url)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(
    ("path", "field", "body"),
    [
        ("/runs/train", "experiment", {"steps": 1, "experiment": "CON"}),
        ("/runs/train", "experiment", {"steps": 1, "experiment": "aux.txt"}),
        ("/runs/train", "experiment", {"steps": 1, "experiment": "a."}),
        ("/runs/train", "experiment", {"steps": 1, "experiment": "latest"}),
        ("/runs/train", "experiment", {"steps": 1, "experiment": "best"}),
        ("/runs/train", "resume_from", {"steps": 1, "resume_from": "nul"}),
        ("/runs/validate", "checkpoint", {"checkpoint": "COM1/step_1"}),
        ("/runs/validate", "experiment", {"checkpoint": "latest", "experiment": "best"}),
        ("/runs/prepare", "name", {"name": "LPT1", "inputs": ["x"]}),
        ("/tokens", "name", {"name": "prn", "scope": "read"}),
        ("/checkpoints/prune", "experiment", {"experiment": "latest", "keep_last": 1}),
    ],
)
def test_a_device_name_a_final_dot_or_a_reference_as_experiment_is_422_naming_the_field(
    served: tuple[str, dict[str, str]], path: str, field: str, body: dict[str, Any]
) -> None:
    url, _ = served
    with httpx.Client(base_url=url, headers={"Host": "localhost"}) as client:
        response = client.post(path, json=body)

    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(f"body.{field}: ")


def test_an_error_that_quotes_what_utf8_cannot_encode_is_still_answered() -> None:
    request = Request({"type": "http", "method": "POST", "path": "/runs/x", "headers": []})

    response = asyncio.run(handle_domain_error(request, InvalidRequest("field \ud800 unknown")))

    assert response.status_code == 422
    assert json.loads(bytes(response.body)) == {"detail": "field \ufffd unknown"}

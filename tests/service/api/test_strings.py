"""Every string the API takes is text it can store and show again (store/text.py): a lone
surrogate anywhere in a body, a NUL in a path or a query parameter, is a 422 naming the
field; nothing is queued or created, and every listing still answers.

The cases come from the app's own schema (tests/service/api/schema.py): each string a body
can hold (fields, list items, dict keys and values) and each string parameter, on SQLite and
on PostgreSQL, through real HTTP.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.service.api.schema import (
    KEY,
    Slot,
    body_schema,
    operations,
    string_slots,
    with_string,
)
from tests.service.fakes import save_checkpoint
from tests.service.serving import serve
from tests.support.databases import BACKENDS, fresh_database
from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.store.kinds.registry import RUN_KINDS

LONE_SURROGATE = "\ud800"
# A body every operation accepts (given what `served` seeds): each case changes one string.
VALID_BODIES: dict[str, dict[str, Any]] = {
    "/runs/train": {"steps": 1, "data": {"source": "synthetic"}, "device": "cpu"},
    "/runs/validate": {"checkpoint": "seeded/step_10", "data": {"source": "synthetic"}},
    "/runs/benchmark": {"steps": 1, "device": "cpu"},
    "/runs/prepare": {"name": "corpus", "inputs": ["corpus.txt"]},
    "/runs/sample": {"checkpoint": "seeded/step_10", "prompt_tokens": [[1, 2]]},
    "/runs/export": {"checkpoint": "seeded/step_10"},
    "/runs/evaluate": {"checkpoint": "seeded/step_10", "tasks": ["arc_easy"]},
    "/runs/forks": {
        "from": "seeded/step_10",
        "variants": [{"experiment": "seeded.a", "steps": 20, "data": {"source": "synthetic"}}],
    },
    "/checkpoints/prune": {"experiment": "seeded", "keep_last": 1, "dry_run": True},
    "/tokens": {"name": "reader", "scope": "read"},
    "/webhooks": {"url": "http://hooks.example/run"},
}
APP = create_app(Settings(data_dir=Path("/nonexistent"), workers=0))
BODY_OPERATIONS = [
    (method, path, schema)
    for method, path, operation in operations(APP)
    if (schema := body_schema(APP, operation)) is not None
]


@dataclass
class Served:
    url: str
    app: FastAPI
    run_id: str

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Host": "localhost"}, timeout=30)

    def created(self) -> dict[str, int]:
        """How many runs, tokens and webhooks there are: what a refused request must not add."""
        with self.client() as client:
            runs = client.get("/runs", params={"limit": 500})
            tokens = client.get("/tokens")
            hooks = client.get("/webhooks")
        assert (runs.status_code, tokens.status_code, hooks.status_code) == (200, 200, 200)
        return {
            "runs": len(runs.json()["items"]),
            "tokens": len(tokens.json()["items"]),
            "webhooks": len(hooks.json()["items"]),
        }


@pytest.fixture(scope="module", params=BACKENDS)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One service per database for the whole module: each case counts what it made."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    roots = tmp_path / "roots"
    roots.mkdir()
    (roots / "corpus.txt").write_text("def f(x):\n    return x\n" * 200)
    with fresh_database(request, request.param, tmp_path) as database_url:
        settings = Settings(
            data_dir=tmp_path / "data", workers=0, data_roots=[roots], database_url=database_url
        )
        app = create_app(settings)
        with serve(app) as url:
            # Byte-level, as a checkpoint trained on text is: an evaluate run can encode tasks.
            bytes_tokenizer = {"tokenizer": {"kind": "bytes", "sha256": None}}
            save_checkpoint(app.state.checkpoints, "seeded", step=10, metadata=bytes_tokenizer)
            with httpx.Client(base_url=url, headers={"Host": "localhost"}) as client:
                seeded = client.post("/runs/benchmark", json={"steps": 1, "device": "cpu"})
            assert seeded.status_code == 202, seeded.text
            yield Served(url, app, seeded.json()["id"])


def test_every_operation_with_a_body_has_a_valid_body_here() -> None:
    """A new operation with a body needs a valid body in VALID_BODIES to be covered."""
    assert sorted(path for _, path, _ in BODY_OPERATIONS) == sorted(VALID_BODIES)
    assert {f"/runs/{kind}" for kind in RUN_KINDS.names()} <= set(VALID_BODIES)


def slots() -> Iterator[Any]:
    for method, path, schema in BODY_OPERATIONS:
        for slot in string_slots(APP.openapi(), schema):
            label = ".".join("<key>" if s is KEY else str(s) for s in slot)
            yield pytest.param(method, path, slot, id=f"{path}:{label}")


def test_each_body_is_accepted_as_it_stands(served: Served) -> None:
    with served.client() as client:
        for method, path, _ in BODY_OPERATIONS:
            response = client.request(method, path, json=VALID_BODIES[path])
            assert response.status_code < 300, (path, response.text)


@pytest.mark.parametrize(("method", "path", "slot"), list(slots()))
def test_a_lone_surrogate_anywhere_in_a_body_is_422_and_nothing_is_made(
    served: Served, method: str, path: str, slot: Slot
) -> None:
    before = served.created()
    body = with_string(VALID_BODIES[path], slot, LONE_SURROGATE)

    with served.client() as client:
        # json.dumps writes the lone surrogate as the escape \ud800: valid JSON text.
        response = client.request(
            method, path, content=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        run = client.get(f"/runs/{served.run_id}")

    assert response.status_code == 422, response.text
    located = [tuple(e["loc"][:2]) for e in response.json()["errors"]]
    assert ("body", slot[0] if slot[0] is not KEY else LONE_SURROGATE) in located or (
        slot[0] is KEY and located == [("body",)]
    ), located
    assert served.created() == before
    assert run.status_code == 200


def string_parameters() -> Iterator[Any]:
    for method, path, operation in operations(APP):
        for parameter in operation.get("parameters", []):
            if (
                parameter["in"] in ("path", "query")
                and parameter["schema"].get("type") != "integer"
            ):
                label = f"{method.upper()} {path} {parameter['in']}.{parameter['name']}"
                yield pytest.param(method, path, parameter, id=label)


@pytest.mark.parametrize(("method", "path", "parameter"), list(string_parameters()))
def test_a_nul_in_a_path_or_query_parameter_is_422_naming_it(
    served: Served, method: str, path: str, parameter: dict[str, Any]
) -> None:
    name, where = parameter["name"], parameter["in"]
    values = {"run_id": served.run_id, "experiment": "seeded", "tag": "step_10"}
    values |= {"name": "metadata.json" if "/files/" in path else "reader", "webhook_id": "1"}
    params: dict[str, str] = {}
    if where == "path":
        values[name] = "a%00b"
    else:
        params[name] = "a\x00b"
    url = path.format(**values)

    with served.client() as client:
        response = client.request(method, url, params=params)

    assert response.status_code == 422, response.text
    assert [where, name] in [e["loc"][:2] for e in response.json()["errors"]]
    assert response.json()["detail"].startswith(f"{where}.{name}: ")


def test_the_schema_states_that_no_string_parameter_holds_a_nul() -> None:
    """A client (and the fuzzer) can know what the server refuses before sending it."""
    for method, path, operation in operations(APP):
        for parameter in operation.get("parameters", []):
            schema = parameter["schema"]
            if schema.get("type") == "string" and "enum" not in schema:
                label = f"{method.upper()} {path} {parameter['name']}"
                assert "pattern" in schema, label
                assert not re.search(schema["pattern"].replace("$", r"\Z"), "a\x00b"), label

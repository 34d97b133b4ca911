"""The committed schema (openapi/openapi.json) is an exact contract: it states the rules the
server enforces, the server keeps to it, and a client generated from it works.

test_fuzz.py tests the same contract from generated requests; these are its clauses, one by
one, and the generated client.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from tests.service.fakes import save_checkpoint
from tests.service.serving import serve
from trainctl.service.app import create_app
from trainctl.service.openapi import OPENAPI_FILE
from trainctl.service.settings import Settings
from trainctl.service.submit import submit_run
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.kinds.benchmark import BenchmarkRequest
from trainctl.store.names import MAX_NAME_LENGTH, NAME_PATTERN, is_valid_name

REPO = Path(__file__).resolve().parents[3]
SCHEMA: dict[str, Any] = json.loads((REPO / OPENAPI_FILE).read_text(encoding="utf-8"))
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
OPERATIONS = [
    (path, method, operation)
    for path, item in SCHEMA["paths"].items()
    for method, operation in item.items()
    if method in METHODS
]
NAMES = {("path", "experiment"), ("path", "tag"), ("path", "name"), ("query", "experiment")}
TOKEN = "contract-token"


def parameters(where: str = "", name: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(operation label, parameter) for every parameter, or those `in` `where` named `name`."""
    for path, method, operation in OPERATIONS:
        for parameter in operation.get("parameters", []):
            if (not where or parameter["in"] == where) and (not name or parameter["name"] == name):
                yield f"{method.upper()} {path}", parameter


def ecma_matches(pattern: str, value: str) -> bool:
    """JSON Schema's `pattern` (ECMA 262): a search, where `$` is the very end (Python's `\\Z`;
    Python's `$` also matches before a final newline)."""
    return re.search(pattern.replace("$", r"\Z"), value) is not None


# --- authentication --------------------------------------------------------------------------


def test_bearer_auth_is_a_security_scheme_on_every_operation_but_healthz() -> None:
    schemes = SCHEMA["components"]["securitySchemes"]
    assert [scheme["scheme"] for scheme in schemes.values()] == ["bearer"]
    assert all(scheme["type"] == "http" for scheme in schemes.values())
    (name,) = schemes

    for path, method, operation in OPERATIONS:
        expected: list[dict[str, list[str]]] | None = None if path == "/healthz" else [{name: []}]
        assert operation.get("security") == expected, f"{method.upper()} {path}"


def test_no_operation_takes_authorization_as_a_parameter() -> None:
    assert [
        label for label, parameter in parameters() if parameter["name"].lower() == "authorization"
    ] == []


# --- names, cursors, parameters --------------------------------------------------------------


def test_every_checkpoint_name_in_a_path_or_query_carries_the_stores_rule() -> None:
    """(The experiment filter of GET /runs takes any text: it matches no run or some.)"""
    named = [
        (label, p)
        for label, p in parameters()
        if (p["in"], p["name"]) in NAMES and " /checkpoints" in label
    ]

    assert len(named) == 12  # 9 in the paths of 4 operations; 3 experiment filters
    for label, parameter in named:
        schema = parameter["schema"]
        assert schema["pattern"] == NAME_PATTERN, label
        assert schema["maxLength"] == MAX_NAME_LENGTH, label
        assert "without '..'" in schema["description"], label


# Names near the rule's edges: dots, a leading or trailing separator, a final newline, lengths
# around the limit, and characters outside it.
NAME_TEXT = st.text(alphabet="aZ9._-/\n é", max_size=12) | st.builds(
    lambda head, n: head + "a" * n, st.sampled_from(["", "a.", "."]), st.integers(120, 135)
)


@given(NAME_TEXT)
def test_the_published_name_pattern_and_length_are_the_servers_rule(name: str) -> None:
    published = ecma_matches(NAME_PATTERN, name) and len(name) <= MAX_NAME_LENGTH

    assert published == is_valid_name(name)


def test_no_parameter_is_nullable() -> None:
    """A query string or a header has no null: an optional parameter is one left out."""
    for label, parameter in parameters():
        assert "null" not in json.dumps(parameter["schema"]), f"{label} {parameter['name']}"


def test_the_list_cursor_states_its_alphabet_length_and_format() -> None:
    ((_, cursor),) = parameters("query", "cursor")

    assert cursor["schema"] | {"description": ""} == {
        "type": "string",
        "title": "Cursor",
        "pattern": "^[A-Za-z0-9_-]+$",
        "minLength": 1,
        "maxLength": 1000,
        "format": "trainctl-cursor",
        "description": "",
    }


def test_a_cursor_outside_the_published_pattern_is_refused_naming_it(client: TestClient) -> None:
    for cursor in ["", "abc!", "YWJj=", "a b"]:
        response = client.get("/runs", params={"cursor": cursor})

        assert response.status_code == 422, cursor
        assert response.json()["detail"].startswith("query.cursor: Value error, invalid cursor")


# --- numbers ---------------------------------------------------------------------------------


def test_an_integral_number_is_an_integer_in_a_body(
    client: TestClient, ckpts: CheckpointStore
) -> None:
    save_checkpoint(ckpts, "exp", step=1)

    for keep_last in ["1.0", "1e0", "0.1e1", "-0.0"]:
        body = f'{{"experiment": "exp", "keep_last": {keep_last}, "dry_run": true}}'
        response = client.post(
            "/checkpoints/prune", content=body, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 200, (keep_last, response.text)

    submitted = client.post("/runs/train", json={"steps": 20.0, "seed": 7e0, "device": "cpu"})
    assert submitted.status_code == 202, submitted.text
    plan = submitted.json()["spec"]
    assert (plan["steps"], plan["seed"]) == (20, 7)
    assert isinstance(plan["steps"], int) and isinstance(plan["seed"], int)


@pytest.mark.slow
@pytest.mark.parametrize("keep_last", ["1.5", "1.0000000000000001", "true", '"1"', "null"])
def test_a_number_with_a_fraction_or_another_json_type_is_still_a_422_naming_the_field(
    client: TestClient, keep_last: str
) -> None:
    body = f'{{"experiment": "exp", "keep_last": {keep_last}}}'
    response = client.post(
        "/checkpoints/prune", content=body, headers={"Content-Type": "application/json"}
    )

    assert response.status_code == 422
    assert response.json()["detail"].startswith("body.keep_last: Input should be a valid integer")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("limit", "status"),
    [
        ("2", 200),
        ("2.0", 200),
        ("2e0", 200),
        ("2.5", 422),
        ("true", 422),
        ("1_0", 422),
        (" 2", 422),
    ],
)
def test_an_integer_query_parameter_is_read_as_a_json_number(
    client: TestClient, limit: str, status: int
) -> None:
    response = client.get("/runs", params={"limit": limit})

    assert response.status_code == status, response.text
    if status == 422:
        assert response.json()["detail"].startswith("query.limit: Input should be a valid integer")


# --- methods ---------------------------------------------------------------------------------


def concrete(path: str) -> str:
    return path.replace("{run_id}", "r1").replace("{experiment}", "e").replace("{tag}", "t") \
        .replace("{name}", "f")  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(SCHEMA["paths"]))
def test_a_method_a_path_does_not_take_is_405_allowing_every_method_it_takes(
    client: TestClient, path: str
) -> None:
    documented = {method.upper() for method in SCHEMA["paths"][path] if method in METHODS}

    for method in ["OPTIONS", "PUT", "PATCH"]:
        response = client.request(method, concrete(path))

        assert response.status_code == 405, (method, path)
        assert set(response.headers["Allow"].split(", ")) == documented, (method, path)


# --- a generated client ----------------------------------------------------------------------

GENERATED_PACKAGE = "trainctl_api_client"


@pytest.fixture
def generated_client(tmp_path: Path) -> Path:
    """The client that openapi-python-client generates from the committed schema, built and
    installed (`pip install --no-deps --target`) into a folder; returns that folder."""
    opc = pytest.importorskip(
        "openapi_python_client",
        reason="openapi-python-client (the dev extra) is not installed: no client to generate",
    )
    from openapi_python_client.config import Config, ConfigFile, MetaType

    config = ConfigFile(
        project_name_override="trainctl-api-client",
        package_name_override=GENERATED_PACKAGE,
        # The tar archive is bytes to a client; the generator names only octet-stream so.
        content_type_overrides={"application/x-tar": "application/octet-stream"},
        post_hooks=[],  # formatting the generated code with ruff; nothing to check
    )
    project = tmp_path / "trainctl-api-client"
    problems = opc.generate(
        config=Config.from_sources(
            config, MetaType.SETUP, REPO / OPENAPI_FILE, "utf-8", True, project
        )
    )
    assert [f"{p.header}: {p.detail}" for p in problems] == []

    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    subprocess.run(
        [*pip, "--no-build-isolation", "--target", str(site), str(project)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return site


LIST_EVERY_RUN = """
import json, sys
from trainctl_api_client import AuthenticatedClient, Client
from trainctl_api_client.api.runs import list_runs
from trainctl_api_client.models import RunsPublic, ErrorPublic

url, token = sys.argv[1:]
with AuthenticatedClient(base_url=url, token=token) as client:
    ids, cursor = [], None
    while True:
        page = list_runs.sync(client=client, limit=2, **({"cursor": cursor} if cursor else {}))
        assert isinstance(page, RunsPublic), page
        ids += [run.id for run in page.items]
        if not page.next_cursor:
            break
        cursor = page.next_cursor
with Client(base_url=url) as anonymous:
    refused = list_runs.sync_detailed(client=anonymous)
    assert isinstance(refused.parsed, ErrorPublic), refused
print(json.dumps({"ids": ids, "without_token": refused.status_code}))
"""


@pytest.mark.slow
def test_a_client_generated_from_the_schema_lists_runs_with_a_token(
    generated_client: Path, tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path / "data", workers=0, api_token=TOKEN)
    app = create_app(settings)
    with serve(app) as url:
        stores = {"runs": app.state.runs, "ckpts": app.state.checkpoints,
                  "exports": app.state.exports, "datasets": app.state.datasets}  # fmt: skip
        submitted = [
            submit_run("benchmark", BenchmarkRequest(steps=n), settings=settings, **stores).id
            for n in range(1, 6)
        ]
        listed = subprocess.run(
            [sys.executable, "-c", LIST_EVERY_RUN, url, TOKEN],
            env={"PYTHONPATH": str(generated_client)},
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == {"ids": submitted[::-1], "without_token": 401}

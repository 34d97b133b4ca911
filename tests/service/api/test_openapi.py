"""The committed OpenAPI file is what the app serves (regenerate it with `make openapi`)."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts

from trainctl.service.openapi import OPENAPI_FILE, render_openapi

REPO = Path(__file__).resolve().parents[3]


def test_committed_openapi_matches_the_app(app: FastAPI) -> None:
    committed = json.loads((REPO / OPENAPI_FILE).read_text(encoding="utf-8"))

    assert app.openapi() == committed, (
        f"{OPENAPI_FILE} is out of date with the API; run `make openapi` and commit the result"
    )


def test_python_m_service_openapi_prints_the_committed_file() -> None:
    assert render_openapi() == (REPO / OPENAPI_FILE).read_text(encoding="utf-8"), (
        f"{OPENAPI_FILE} differs from `python -m trainctl.service.openapi`; run `make openapi`"
    )


def test_each_operation_is_named_after_its_handler_and_summarised_by_its_docstring(
    app: FastAPI,
) -> None:
    paths = app.openapi()["paths"]
    # The routes of included routers, with their prefixes (`app.routes` holds the routers).
    routes = [r for r in iter_route_contexts(app.routes) if isinstance(r.original_route, APIRoute)]

    assert len(routes) == sum(len(operations) for operations in paths.values())
    for route in routes:
        for method in route.methods or ():
            operation = paths[route.path_format][method.lower()]
            assert operation["operationId"] == route.name
            assert operation["summary"] == (route.endpoint.__doc__ or "").strip().splitlines()[0]


def test_the_request_models_are_the_request_bodies(app: FastAPI) -> None:
    paths = app.openapi()["paths"]

    body = paths["/runs/train"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/TrainRequest"}

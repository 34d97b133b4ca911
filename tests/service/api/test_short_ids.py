"""A run's short id (its id's first 8 characters, or any longer prefix) is accepted wherever its
id is: every route with a `{run_id}` in its path, found in the app's own routes so that a route
added later is held to it too, on SQLite and PostgreSQL (store.db.runs.RunStore.resolve_id)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy import update

from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.store.db.runs import RunStore
from trainctl.store.db.schema import runs as runs_table

# Three runs' ids, chosen: the first two share their first 8 characters, the third does not.
TWINS = ("abcdef01" + "1" * 24, "abcdef01" + "2" * 24)
LONE = "12345678" + "9" * 24


@pytest.fixture
def service(tmp_path: Path, database_url: str) -> Iterator[TestClient]:
    """A service with three finished (cancelled) runs whose ids are TWINS and LONE."""
    settings = Settings(data_dir=tmp_path, workers=0, database_url=database_url)
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        runs: RunStore = client.app.state.runs  # type: ignore[attr-defined]
        for name, run_id in zip(("a", "b", "c"), (*TWINS, LONE), strict=True):
            queued = runs.enqueue("benchmark", name, {"steps": 1})
            with runs.engine.begin() as conn:  # a queued run has no events yet to follow it
                conn.execute(
                    update(runs_table).where(runs_table.c.id == queued.id).values(id=run_id)
                )
            runs.request_cancel(run_id)  # finished: its event stream ends
        yield client


def run_routes(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every route of one run: those with `{run_id}` in their path (the
    routes of included routers, with their prefixes: `app.routes` holds the routers)."""
    found = [
        (method, route.path or "")
        for route in iter_route_contexts(app.routes)
        if isinstance(route.original_route, APIRoute) and "{run_id}" in (route.path or "")
        for method in sorted(route.methods or ())
    ]
    assert len(found) >= 6, found  # read, lineage, cancel, events, metrics, logs at least
    return found


def test_every_route_of_a_run_takes_its_short_id_and_answers_as_for_its_whole_id(
    service: TestClient,
) -> None:
    for method, path in run_routes(service.app):  # type: ignore[arg-type]
        whole = service.request(method, path.replace("{run_id}", LONE))
        short = service.request(method, path.replace("{run_id}", LONE[:8]))
        longer = service.request(method, path.replace("{run_id}", LONE[:12]))

        assert whole.status_code != 404, (path, whole.text)  # a cancel's is a 409: finished
        assert short.status_code == longer.status_code == whole.status_code, (path, short.text)
        assert short.text == longer.text == whole.text, path  # the same run, the same answer


def test_a_prefix_two_runs_share_is_a_409_naming_it_and_how_many_match(
    service: TestClient,
) -> None:
    for method, path in run_routes(service.app):  # type: ignore[arg-type]
        response = service.request(method, path.replace("{run_id}", "abcdef01"))

        assert response.status_code == 409, (path, response.text)
        assert response.json()["detail"] == (
            "run id prefix 'abcdef01' matches 2 runs; give more of the id, or all of it"
        )
        # One character more tells the twins apart.
        nine = service.request(method, path.replace("{run_id}", TWINS[1][:9]))
        assert nine.text == service.request(method, path.replace("{run_id}", TWINS[1])).text


@pytest.mark.parametrize(
    ("run_id", "says"),
    [
        ("fedcba98", "run 'fedcba98' does not exist"),
        ("f" * 32, f"run '{'f' * 32}' does not exist"),
        ("nope-not-a-run", "run 'nope-not-a-run' does not exist"),
        (
            LONE[:7],
            f"run '{LONE[:7]}' does not exist; a prefix of a run's id names it only from 8 "
            "characters on",
        ),
    ],
)
def test_an_unknown_id_or_a_prefix_under_8_characters_is_a_404_on_every_route_of_a_run(
    service: TestClient, run_id: str, says: str
) -> None:
    for method, path in run_routes(service.app):  # type: ignore[arg-type]
        response = service.request(method, path.replace("{run_id}", run_id))

        assert response.status_code == 404, (path, response.text)
        assert response.json()["detail"] == says


def test_a_run_shows_its_short_id_in_every_answer(service: TestClient) -> None:
    listed = service.get("/runs").json()["items"]
    lineage = service.get(f"/runs/{LONE[:8]}/lineage").json()

    assert {r["id"]: r["short_id"] for r in listed} == {i: i[:8] for i in (*TWINS, LONE)}
    assert service.get(f"/runs/{LONE}").json()["short_id"] == "12345678"
    assert lineage["run"]["short_id"] == "12345678"

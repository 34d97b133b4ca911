"""API tokens with names and scopes: who may read, submit or administer, and who submitted
each run (store/db/tokens.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.fakes import save_checkpoint
from tests.support.stores import posix_store
from trainctl.service.app import create_app
from trainctl.service.settings import Settings

BOOT = "bootstrap-token"
CPU_BENCHMARK = {"steps": 2, "warmup_steps": 0, "device": "cpu"}


@pytest.fixture
def app_settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path, workers=0, api_token=BOOT, max_queued_runs=5, max_queued_runs_per_token=2
    )


@pytest.fixture
def api(app_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(app_settings), base_url="http://localhost") as client:
        yield client


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def create(api: TestClient, name: str, scope: str, by: str = BOOT) -> str:
    response = api.post("/tokens", json={"name": name, "scope": scope}, headers=auth(by))
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token


def test_an_admin_creates_lists_and_revokes_tokens_and_the_token_is_shown_once(
    api: TestClient,
) -> None:
    token = create(api, "alice", "submit")

    listed = api.get("/tokens", headers=auth(BOOT)).json()["items"]
    assert [(t["name"], t["scope"], t["created_by"]) for t in listed] == [
        ("alice", "submit", "bootstrap")
    ]
    assert all(token not in str(t) for t in listed)
    assert api.get("/runs", headers=auth(token)).status_code == 200

    assert api.delete("/tokens/alice", headers=auth(BOOT)).status_code == 200
    assert api.get("/runs", headers=auth(token)).status_code == 401
    assert api.get("/tokens", headers=auth(BOOT)).json()["items"] == []


def test_the_database_keeps_no_token_only_its_digest(api: TestClient, tmp_path: Path) -> None:
    token = create(api, "bob", "read")

    database = (tmp_path / "trainctl.db").read_bytes()

    assert token.encode() not in database


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scope", "allowed"),
    [
        ("read", {"list"}),
        ("submit", {"list", "submit", "cancel"}),
        ("admin", {"list", "submit", "cancel", "delete", "prune", "tokens"}),
    ],
)
def test_each_scope_allows_what_it_says_and_no_more(
    api: TestClient, app_settings: Settings, scope: str, allowed: set[str]
) -> None:
    save_checkpoint(posix_store(app_settings.checkpoint_dir), "exp", step=10)
    token = create(api, "holder", scope)
    # Its own run when it may submit: a submit token cancels only those (test_authority).
    owner = BOOT if scope == "read" else token
    queued = api.post("/runs/benchmark", json=CPU_BENCHMARK, headers=auth(owner)).json()["id"]
    attempts: dict[str, Any] = {
        "list": lambda: api.get("/runs", headers=auth(token)),
        "submit": lambda: api.post("/runs/benchmark", json=CPU_BENCHMARK, headers=auth(token)),
        "cancel": lambda: api.post(f"/runs/{queued}/cancel", headers=auth(token)),
        "prune": lambda: api.post(
            "/checkpoints/prune", json={"experiment": "exp", "keep_last": 1}, headers=auth(token)
        ),
        "delete": lambda: api.delete("/checkpoints/exp/step_10", headers=auth(token)),
        "tokens": lambda: api.get("/tokens", headers=auth(token)),
    }

    for action, attempt in attempts.items():
        response = attempt()
        if action in allowed:
            assert response.status_code < 400, (action, response.text)
        else:
            assert response.status_code == 403, (action, response.text)
            assert f"has scope {scope!r}" in response.json()["detail"]


def test_runs_record_who_submitted_them_and_list_by_it(api: TestClient) -> None:
    alice, bob = create(api, "alice", "submit"), create(api, "bob", "submit")
    mine = api.post("/runs/benchmark", json=CPU_BENCHMARK, headers=auth(alice)).json()
    api.post("/runs/benchmark", json=CPU_BENCHMARK, headers=auth(bob))

    assert mine["submitted_by"] == "alice"
    listed = api.get("/runs?submitted_by=alice", headers=auth(bob)).json()["items"]
    assert [r["id"] for r in listed] == [mine["id"]]


def test_a_full_queue_is_429_with_retry_after_per_token_and_in_all(api: TestClient) -> None:
    alice, bob, carol = (create(api, n, "submit") for n in ("alice", "bob", "carol"))
    for token in (alice, alice):
        assert api.post("/runs/benchmark", json=CPU_BENCHMARK, headers=auth(token)).is_success

    third = api.post("/runs/benchmark", json=CPU_BENCHMARK, headers=auth(alice))
    assert third.status_code == 429
    assert int(third.headers["Retry-After"]) > 0
    assert "token 'alice' has 2 runs queued" in third.json()["detail"]

    for token in (bob, bob, carol):  # 5 queued in all, the service's limit here
        assert api.post("/runs/benchmark", json=CPU_BENCHMARK, headers=auth(token)).is_success
    full = api.post("/runs/benchmark", json=CPU_BENCHMARK, headers=auth(carol))
    assert full.status_code == 429
    assert "5 runs are queued already" in full.json()["detail"]


def test_token_names_are_unique_and_the_bootstrap_name_is_taken(api: TestClient) -> None:
    create(api, "alice", "read")
    again = api.post("/tokens", json={"name": "alice", "scope": "admin"}, headers=auth(BOOT))
    boot = api.post("/tokens", json={"name": "bootstrap", "scope": "read"}, headers=auth(BOOT))

    assert again.status_code == 409 and "exists already" in again.json()["detail"]
    assert boot.status_code == 409
    assert api.delete("/tokens/nobody", headers=auth(BOOT)).status_code == 404

"""Who may act on what (docs/design/access.md, "Admission and access"), over real HTTP on
SQLite and PostgreSQL: a submit token cancels only its own runs and an admin any, a run
queued without a token only an admin; an idempotency key is its token's own; token names
are one in any case."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.serving import serve
from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.store.db.runs import RunStore

BOOT = "bootstrap-token"
BENCHMARK = {"steps": 2, "warmup_steps": 0, "device": "cpu"}


@dataclass
class Api:
    url: str
    runs: RunStore

    def call(self, method: str, path: str, token: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}", **kw.pop("headers", {})}
        return httpx.request(method, self.url + path, headers=headers, timeout=30, **kw)

    def token(self, name: str, scope: str) -> str:
        made = self.call("POST", "/tokens", BOOT, json={"name": name, "scope": scope})
        assert made.status_code == 201, made.text
        token: str = made.json()["token"]
        return token

    def submit(self, token: str, key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": key} if key else {}
        answer = self.call("POST", "/runs/benchmark", token, json=BENCHMARK, headers=headers)
        assert answer.status_code == 202, answer.text
        run: dict[str, Any] = answer.json()
        return run

    def cancel(self, run_id: str, token: str) -> httpx.Response:
        return self.call("POST", f"/runs/{run_id}/cancel", token)


@pytest.fixture
def api(tmp_path: Path, database_url: str) -> Iterator[Api]:
    settings = Settings(data_dir=tmp_path, workers=0, api_token=BOOT, database_url=database_url)
    with serve(create_app(settings)) as url, RunStore(database_url) as runs:
        yield Api(url, runs)


# --- cancel -----------------------------------------------------------------------------------


def test_a_submit_token_cancels_its_own_runs_and_no_one_elses(api: Api) -> None:
    alice, bob = api.token("alice", "submit"), api.token("bob", "submit")
    hers, his = api.submit(alice), api.submit(bob)

    refused = api.cancel(hers["id"], bob)
    assert refused.status_code == 403
    assert refused.json()["detail"] == (
        f"run {hers['id']} was submitted by 'alice'; token 'bob' may cancel only the runs it "
        "submitted, and an admin token any run"
    )
    assert api.runs.get(hers["id"]).state == "queued"  # untouched

    assert api.cancel(his["id"], bob).json()["state"] == "cancelled"
    assert api.cancel(hers["id"], alice).json()["state"] == "cancelled"


def test_an_admin_token_cancels_any_run(api: Api) -> None:
    alice, admin = api.token("alice", "submit"), api.token("ops", "admin")
    hers, queued_before_tokens = api.submit(alice), api.runs.enqueue("benchmark", "x", {})

    assert api.cancel(hers["id"], admin).json()["state"] == "cancelled"
    assert api.cancel(queued_before_tokens.id, BOOT).json()["state"] == "cancelled"


def test_a_run_queued_without_a_token_is_an_admins_to_cancel(api: Api) -> None:
    """Queued while the service had no TRAINCTL_API_TOKEN: no one submitted it."""
    run = api.runs.enqueue("benchmark", "x", {})
    alice = api.token("alice", "submit")

    refused = api.cancel(run.id, alice)
    assert refused.status_code == 403
    assert "queued without a token" in refused.json()["detail"]
    assert "only an admin token may cancel it" in refused.json()["detail"]
    assert api.runs.get(run.id).state == "queued"


def test_a_run_is_its_submitters_whatever_the_case_of_the_name(api: Api) -> None:
    """A token revoked and made again in another case is the same name."""
    first = api.token("Alice", "submit")
    run = api.submit(first)
    assert api.call("DELETE", "/tokens/Alice", BOOT).status_code == 200
    again = api.token("alice", "submit")

    assert api.cancel(run["id"], again).json()["state"] == "cancelled"


# --- idempotency keys -------------------------------------------------------------------------


def test_an_idempotency_key_is_its_tokens_own(api: Api) -> None:
    alice, bob = api.token("alice", "submit"), api.token("bob", "submit")
    hers = api.submit(alice, key="nightly")

    his = api.submit(bob, key="nightly")
    assert his["id"] != hers["id"] and his["submitted_by"] == "bob"
    assert api.submit(alice, key="nightly")["id"] == hers["id"]  # her retry: her run
    assert api.submit(bob, key="nightly")["id"] == his["id"]
    # Another body under the key is still a conflict, within one token's keys.
    other = api.call(
        "POST", "/runs/benchmark", bob, json={**BENCHMARK, "steps": 3},
        headers={"Idempotency-Key": "nightly"},
    )  # fmt: skip
    assert other.status_code == 409 and his["id"] in other.json()["detail"]


# --- token names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("T-READ", "a token named 't-read' exists already"),
        ("t-Read", "a token named 't-read' exists already"),
        ("BOOTSTRAP", "'bootstrap' is the name of TRAINCTL_API_TOKEN"),
        ("Bootstrap", "'bootstrap' is the name of TRAINCTL_API_TOKEN"),
    ],
)
def test_a_token_name_that_differs_only_by_case_is_taken(api: Api, name: str, why: str) -> None:
    api.token("t-read", "read")

    taken = api.call("POST", "/tokens", BOOT, json={"name": name, "scope": "admin"})

    assert taken.status_code == 409 and why in taken.json()["detail"], taken.text


def test_a_token_is_revoked_by_its_name_in_any_case(api: Api) -> None:
    token = api.token("t-read", "read")

    revoked = api.call("DELETE", "/tokens/T-READ", BOOT)

    assert revoked.status_code == 200 and revoked.json()["name"] == "t-read"
    assert api.call("GET", "/runs", token).status_code == 401


# --- drain ------------------------------------------------------------------------------------


def test_only_an_admin_drains_a_worker_and_an_unknown_one_is_a_404(api: Api) -> None:
    api.runs.workers.register("w1", host="h", pid=1, device="cpu", info={})
    for scope in ("read", "submit"):
        refused = api.call("POST", "/workers/w1/drain", api.token(f"a-{scope}", scope))
        assert refused.status_code == 403, refused.text
    assert api.runs.workers.heartbeat("w1") is False

    drained = api.call("POST", "/workers/w1/drain", BOOT)
    assert drained.status_code == 200 and drained.json()["draining"] is True
    (listed,) = api.call("GET", "/workers", BOOT).json()["items"]
    assert listed["draining"] is True and listed["drain_requested_at"] is not None
    unknown = api.call("POST", "/workers/nobody/drain", BOOT)
    assert unknown.status_code == 404
    assert unknown.json()["detail"] == (
        "worker 'nobody' is not registered; GET /workers (trainctl workers) lists those that are"
    )

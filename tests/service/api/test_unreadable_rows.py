"""A row the API cannot show as it is never breaks an answer for anyone: over real HTTP, on
SQLite and PostgreSQL, runs, events, workers, tokens and webhooks written straight into the
database with a lone surrogate (or, on SQLite, bytes that are not UTF-8) are listed, read and
cancelled; what cannot be shown is replaced or repaired (store/db/rows.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.serving import serve
from tests.support.rows import SURROGATE_SPEC, Poison
from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.store.db.rows import UNREADABLE
from trainctl.store.db.runs import RunStore


@pytest.fixture
def poisoned(tmp_path: Path, database_url: str) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    """A service whose database holds one good and one bad row of each kind."""
    settings = Settings(data_dir=tmp_path, workers=0, database_url=database_url)
    app = create_app(settings)
    with serve(app) as url, httpx.Client(base_url=url, headers={"Host": "localhost"}) as client:
        runs: RunStore = app.state.runs
        sqlite = runs.engine.dialect.name == "sqlite"
        good = runs.enqueue("benchmark", "good", {"steps": 1})
        bad = runs.enqueue("benchmark", "bad", {"steps": 1})
        Poison("spec", SURROGATE_SPEC).write(runs, "runs", "id", bad.id)
        if sqlite:
            Poison("error", raw=b"oops \xed\xa0\x80").write(runs, "runs", "id", bad.id)
        for message in ("fine", "bad"):
            event = runs.append_event(bad.id, "log", {"level": "info", "message": message})
        Poison("data", '{"level": "info", "message": "x\\ud800"}').write(
            runs, "run_events", "id", str(event)
        )
        for worker in ("good", "bad"):
            runs.workers.register(worker, host="n", pid=1, device="cpu", info={"cores": 2})
        Poison("info", '{"gpus": ["\\ud800"]}').write(runs, "workers", "id", "bad")
        for name in ("good", "bad"):
            assert client.post("/tokens", json={"name": name, "scope": "read"}).status_code == 201
        hook = client.post("/webhooks", json={"url": "http://hooks.example/a"})
        assert hook.status_code == 201, hook.text
        Poison("events", '["succeeded", "\\ud800"]').write(
            runs, "webhooks", "id", str(hook.json()["id"])
        )
        if sqlite:
            Poison("created_by", raw=b"\xff").write(runs, "api_tokens", "name", "bad")
            Poison("url", raw=b"http://hooks.example/\xff").write(
                runs, "webhooks", "id", str(hook.json()["id"])
            )
        yield client, {"good": good.id, "bad": bad.id}


def shown(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


def test_the_run_listing_and_the_run_answer_with_a_bad_row_among_good_ones(
    poisoned: tuple[httpx.Client, dict[str, str]],
) -> None:
    client, ids = poisoned

    listed = {run["id"]: run for run in shown(client.get("/runs"))["items"]}
    read = shown(client.get(f"/runs/{ids['bad']}"))

    assert set(listed) == {ids["good"], ids["bad"]}
    assert listed[ids["good"]]["spec"] == {"steps": 1}
    for run in (listed[ids["bad"]], read):
        assert list(run["spec"]) == [UNREADABLE]
        assert "lone surrogate" in run["spec"][UNREADABLE]
        assert run["error"] in (None, "oops \ufffd\ufffd\ufffd")


def test_a_bad_run_is_cancelled_and_its_history_read(
    poisoned: tuple[httpx.Client, dict[str, str]],
) -> None:
    client, ids = poisoned

    cancelled = client.post(f"/runs/{ids['bad']}/cancel")
    logs = shown(client.get(f"/runs/{ids['bad']}/logs"))["items"]
    text = client.get(f"/runs/{ids['bad']}/logs", params={"format": "text"})
    with client.stream("GET", f"/runs/{ids['bad']}/events") as stream:
        frames = [json.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data:")]

    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert [entry["message"] for entry in logs] == ["fine", "x\ufffd"]
    assert text.status_code == 200 and "x\ufffd" in text.text
    assert [f.get("data", {}).get("message") for f in frames[:2]] == ["fine", "x\ufffd"]


def test_workers_tokens_and_webhooks_list_their_bad_rows_too(
    poisoned: tuple[httpx.Client, dict[str, str]],
) -> None:
    client, _ = poisoned

    workers = {w["id"]: w for w in shown(client.get("/workers"))["items"]}
    tokens = {t["name"] for t in shown(client.get("/tokens"))["items"]}
    (hook,) = shown(client.get("/webhooks"))["items"]

    assert workers["bad"]["info"] == {"gpus": ["\ufffd"]}
    assert tokens == {"good", "bad"}
    assert hook["events"] == ["succeeded"]

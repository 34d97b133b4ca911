"""Forks over the API (docs/design/forks.md, "Forks"): what a fork may not change is a 422 at
submit naming the field, its parent checkpoint is protected while it is queued, and its
lineage reads as a tree."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.api.submits import CPU_TRAIN, submit
from tests.service.fakes import save_checkpoint
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.runs import RunStore

FORK = {"experiment": "fork", "steps": 100, "device": "cpu", "fork_from": "parent/step_10"}


def parent_checkpoint(ckpts: CheckpointStore, **metadata: Any) -> None:
    save_checkpoint(ckpts, "parent", step=10, metadata={"optimizer_kind": "muon_adamw", **metadata})


def test_a_fork_pins_its_parent_checkpoint_records_its_parent_and_protects_it(
    client: TestClient, ckpts: CheckpointStore, runs: RunStore
) -> None:
    parent_checkpoint(ckpts)

    response = submit(client, "train", FORK | {"fork_from": "parent/latest"})

    assert response.status_code == 202, response.text
    run = response.json()
    assert run["spec"]["fork_from"] == {
        "checkpoint": {"experiment": "parent", "tag": "step_10"},
        "step": 10,
        "run_id": "run-1",
    }
    assert run["spec"]["resume_from"] is None
    assert run["parent"] == {
        "run_id": "run-1",
        "experiment": "parent",
        "tag": "step_10",
        "step": 10,
    }
    assert ("parent", "step_10") in runs.protected_checkpoints()
    refused = client.delete("/checkpoints/parent/step_10")
    assert refused.status_code == 409

    client.post(f"/runs/{run['id']}/cancel")
    assert ("parent", "step_10") not in runs.protected_checkpoints()
    assert client.delete("/checkpoints/parent/step_10").status_code == 200


def test_a_fork_with_its_own_schedule_in_steps_is_accepted(
    client: TestClient, ckpts: CheckpointStore
) -> None:
    parent_checkpoint(ckpts)
    schedule = {"decay_start": 10, "decay_steps": 20, "decay": "sqrt", "min_lr_ratio": 0}

    response = submit(client, "train", FORK | {"steps": 30, "schedule": schedule})

    assert response.status_code == 202, response.text
    assert response.json()["spec"]["schedule"] | schedule == response.json()["spec"]["schedule"]


OTHER_MODEL = {"model": {"overrides": {"n_layers": 3}}}


@pytest.mark.parametrize(
    ("change", "metadata", "field", "says"),
    [
        ({"experiment": "parent"}, {}, "experiment", "an experiment of its own"),
        ({"fork_from": "parent/step_20"}, {}, "fork_from", "no checkpoint 'step_20'"),
        ({"fork_from": "nope/latest"}, {}, "fork_from", "experiment 'nope' has no checkpoint"),
        (OTHER_MODEL, {}, "fork_from", "n_layers: checkpoint 2 vs requested 3"),
        ({}, {"tokenizer": {"kind": "bpe", "sha256": "ab" * 32}}, "checkpoint", "tokenizer"),
        ({}, {"optimizer_kind": "adamw"}, "optimizer.kind", "optimizer kind 'adamw'"),
        ({"optimizer": {"kind": "adamw"}}, {}, "optimizer.kind", "not 'adamw'"),
        ({"steps": 10}, {}, "steps", "steps must be above 10"),
        ({"schedule": {"decay_start": 5}}, {}, "schedule.decay_start", "before the fork's"),
        ({"schedule": {"decay_start": 101}}, {}, "schedule.decay_start", "beyond the run's"),
        (
            {"schedule": {"decay_start": 50, "decay_steps": 60}},
            {},
            "schedule.decay_steps",
            "beyond the run's steps (100)",
        ),
    ],
)
def test_what_a_fork_cannot_change_is_a_422_naming_it(
    client: TestClient,
    ckpts: CheckpointStore,
    change: dict[str, Any],
    metadata: dict[str, Any],
    field: str,
    says: str,
) -> None:
    parent_checkpoint(ckpts, **metadata)

    response = submit(client, "train", FORK | change)

    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith(field) or f"{field}:" in detail, detail
    assert says in detail


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (FORK | {"fork_from": "parent"}, "body.fork_from"),
        (FORK | {"fork_from": "a/b/c"}, "body.fork_from"),
        (FORK | {"resume_from": "latest"}, "fork_from and resume_from"),
        (CPU_TRAIN | {"schedule": {"decay_steps": 101}}, "decay_steps 101 is beyond"),
    ],
)
def test_a_malformed_fork_request_is_a_422(client: TestClient, body: Any, field: str) -> None:
    response = submit(client, "train", body)

    assert response.status_code == 422
    assert field in response.text


def test_lineage_shows_ancestors_and_descendants(
    client: TestClient, ckpts: CheckpointStore
) -> None:
    root = submit(client, "train", CPU_TRAIN | {"experiment": "parent"}).json()
    parent_checkpoint(ckpts, run_id=root["id"])
    child = submit(client, "train", FORK | {"experiment": "child"}).json()
    save_checkpoint(ckpts, "child", step=20, metadata={"run_id": child["id"]})
    grandchild = submit(
        client, "train", FORK | {"experiment": "grandchild", "fork_from": "child/step_20"}
    ).json()
    sibling = submit(client, "train", FORK | {"experiment": "sibling"}).json()

    tree = client.get(f"/runs/{root['id']}/lineage").json()
    assert tree["ancestors"] == [] and tree["run"]["id"] == root["id"]
    assert tree["run"]["parent"] is None
    assert [f["id"] for f in tree["forks"]] == [child["id"], sibling["id"]]
    assert [f["id"] for f in tree["forks"][0]["forks"]] == [grandchild["id"]]
    assert tree["forks"][0]["parent"]["tag"] == "step_10"

    middle = client.get(f"/runs/{child['id']}/lineage").json()
    assert [a["id"] for a in middle["ancestors"]] == [root["id"]]
    assert [f["id"] for f in middle["forks"]] == [grandchild["id"]]

    leaf = client.get(f"/runs/{grandchild['id']}/lineage").json()
    assert [a["id"] for a in leaf["ancestors"]] == [root["id"], child["id"]]
    assert leaf["forks"] == []
    assert client.get("/runs/nope/lineage").status_code == 404

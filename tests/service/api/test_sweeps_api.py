"""A sweep over the API (`POST /runs/forks`, store/kinds/sweeps.py): several forks of one checkpoint
queued in one request, all of them or none, under one idempotency key."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.api.submits import CPU_TRAIN, submit
from tests.service.fakes import save_checkpoint
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.runs import RunStore


def cooldown(name: str, steps: int) -> dict[str, Any]:
    """A variant: a 1-sqrt cooldown over the `steps` steps after the fork at step 10."""
    schedule = {"decay_start": 10, "decay_steps": steps, "decay": "sqrt", "min_lr_ratio": 0}
    return {"experiment": name, "steps": 10 + steps, "device": "cpu", "schedule": schedule}


SWEEP: dict[str, Any] = {
    "from": "stable/step_10",
    "variants": [
        cooldown("stable.cool10", 10),
        cooldown("stable.cool20", 20),
        cooldown("stable.cool40", 40),
    ],
}


@pytest.fixture
def stable(ckpts: CheckpointStore) -> None:
    """The stable phase's checkpoint the sweeps fork from."""
    save_checkpoint(ckpts, "stable", step=10, metadata={"optimizer_kind": "muon_adamw"})


def sweep(client: TestClient, body: Any, **headers: str) -> Any:
    return client.post("/runs/forks", json=body, headers=headers)


def queued(client: TestClient) -> list[str]:
    return sorted(run["experiment"] for run in client.get("/runs").json()["items"])


def test_a_sweep_queues_one_fork_per_variant_in_their_order(
    client: TestClient, runs: RunStore, stable: None
) -> None:
    response = sweep(client, SWEEP)

    assert response.status_code == 202, response.text
    items = response.json()["items"]
    assert [run["experiment"] for run in items] == [
        "stable.cool10",
        "stable.cool20",
        "stable.cool40",
    ]
    for run, steps in zip(items, (10, 20, 40), strict=True):
        assert run["state"] == "queued" and run["kind"] == "train"
        assert run["parent"] == {
            "run_id": "run-1",
            "experiment": "stable",
            "tag": "step_10",
            "step": 10,
        }
        assert run["spec"]["steps"] == 10 + steps
        assert run["spec"]["schedule"]["decay_steps"] == steps
        assert client.get(f"/runs/{run['short_id']}").json() == run
    assert ("stable", "step_10") in runs.protected_checkpoints()


def test_a_sweep_retried_with_its_key_gets_the_same_runs_and_another_body_is_a_409(
    client: TestClient, stable: None
) -> None:
    first = sweep(client, SWEEP, **{"Idempotency-Key": "cool-sweep"})
    again = sweep(client, SWEEP, **{"Idempotency-Key": "cool-sweep"})
    other = sweep(
        client, SWEEP | {"variants": SWEEP["variants"][:2]}, **{"Idempotency-Key": "cool-sweep"}
    )
    single = submit(client, "train", CPU_TRAIN, **{"Idempotency-Key": "cool-sweep"})

    assert first.status_code == again.status_code == 202, again.text
    assert [r["id"] for r in again.json()["items"]] == [r["id"] for r in first.json()["items"]]
    for refused in (other, single):
        assert refused.status_code == 409, refused.text
        assert (
            "idempotency key 'cool-sweep' was already used for a different request" in refused.text
        )
    assert len(queued(client)) == 3


@pytest.mark.parametrize(
    ("variant", "says"),
    [
        ({"steps": 10, "schedule": {}}, "variants.1: steps: fork_from"),  # each fork 422
        ({"experiment": "stable"}, "variants.1: experiment"),
        ({"model": {"overrides": {"n_layers": 3}}}, "variants.1: fork_from"),
        ({"optimizer": {"kind": "adamw"}}, "variants.1: optimizer.kind"),
    ],
)
def test_one_variant_refused_queues_none_and_the_422_names_it(
    client: TestClient, stable: None, variant: dict[str, Any], says: str
) -> None:
    body = SWEEP | {
        "variants": [SWEEP["variants"][0], SWEEP["variants"][1] | variant, SWEEP["variants"][2]]
    }

    response = sweep(client, body)

    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith(says), response.json()["detail"]
    assert queued(client) == []


def test_a_variant_whose_experiment_is_busy_is_a_409_and_queues_none(
    client: TestClient, stable: None
) -> None:
    busy = submit(client, "train", CPU_TRAIN | {"experiment": "stable.cool40"}).json()

    response = sweep(client, SWEEP)

    assert response.status_code == 409, response.text
    assert busy["id"] in response.json()["detail"]
    assert queued(client) == ["stable.cool40"]  # the busy run alone: the first two went back


@pytest.mark.parametrize(
    ("variants", "says"),
    [
        (
            [cooldown("stable.cool", 10), cooldown("stable.cool", 20)],
            "variants.1.experiment: 'stable.cool' is variants.0's too",
        ),
        ([{"steps": 20}, {"steps": 30}], "variants.1.experiment: 'default' is variants.0's too"),
        ([cooldown("a", 10) | {"fork_from": "stable/step_10"}], "variants.0.fork_from"),
        ([cooldown("a", 10) | {"resume_from": "latest"}], "variants.0.resume_from"),
        ([], "body.variants: List should have at least 1 item"),
    ],
)
def test_variants_must_be_forks_of_their_own_experiments(
    client: TestClient, stable: None, variants: list[dict[str, Any]], says: str
) -> None:
    response = sweep(client, {"from": "stable/step_10", "variants": variants})

    assert response.status_code == 422, response.text
    assert says in response.json()["detail"]
    assert queued(client) == []


def test_a_sweep_from_a_checkpoint_that_does_not_exist_names_the_first_variant(
    client: TestClient,
) -> None:
    response = sweep(client, SWEEP | {"from": "stable/step_10"})

    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("variants.0: fork_from")

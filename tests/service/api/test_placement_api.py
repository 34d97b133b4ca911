"""Placement, priorities and attempts over HTTP: a run never fails for lack of GPUs, it waits
and says why; only more GPUs per node than TRAINCTL_MAX_GPUS_PER_NODE is a 422; priority and
max_attempts are kept per run; /workers shows what each worker has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.api.submits import submit
from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.store.db.runs import RunStore

GPU_TRAIN = {"experiment": "gpu", "steps": 10, "device": "cuda", "nproc_per_node": 2}
CPU_TRAIN = {"experiment": "cpu", "steps": 10, "device": "cpu"}


def test_a_cuda_run_on_a_cpu_only_service_is_queued_and_says_what_it_waits_for(
    client: TestClient, runs: RunStore
) -> None:
    runs.workers.register("cpu-1", host="n1", pid=1, device="cpu", info={}, cpus=4)

    response = submit(client, "train", GPU_TRAIN)

    assert response.status_code == 202, response.text
    run = response.json()
    assert run["placement"] == {
        "nnodes": 1, "gpus_per_node": 2, "procs_per_node": 2, "spread": "any",
        "min_nnodes": None, "shrink_after_seconds": 0.0, "avoid_nodes": [],
    }  # fmt: skip
    shown = client.get(f"/runs/{run['id']}").json()
    assert shown["state"] == "queued"
    assert "needs 2 GPUs per node" in shown["waiting_reason"]
    assert "no live worker has a GPU" in shown["waiting_reason"]
    assert shown == run  # the submit answer says it already
    listed = client.get("/runs", params={"state": "queued"}).json()["items"]
    assert [r["waiting_reason"] for r in listed] == [shown["waiting_reason"]]


def test_a_queued_run_a_live_worker_can_take_does_not_say_it_waits(
    client: TestClient, runs: RunStore
) -> None:
    runs.workers.register("cpu-1", host="n1", pid=1, device="cpu", info={}, cpus=4)
    run = submit(client, "train", CPU_TRAIN).json()

    assert run["state"] == "queued" and run["waiting_reason"] is None
    assert run["placement"]["gpus_per_node"] == 0


def test_with_no_live_worker_a_queued_run_says_so(client: TestClient) -> None:
    run = submit(client, "train", CPU_TRAIN).json()

    assert run["waiting_reason"].endswith("no worker is live")


def test_a_run_not_queued_has_no_waiting_reason(client: TestClient, runs: RunStore) -> None:
    run = submit(client, "train", GPU_TRAIN).json()
    cancelled = client.post(f"/runs/{run['id']}/cancel").json()

    assert cancelled["state"] == "cancelled" and cancelled["waiting_reason"] is None


def test_more_gpus_per_node_than_the_service_allows_is_422_naming_both_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINCTL_MAX_GPUS_PER_NODE", "4")
    settings = Settings(data_dir=tmp_path, workers=0)
    assert settings.max_gpus_per_node == 4
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        refused = submit(client, "train", GPU_TRAIN | {"nproc_per_node": 8})
        accepted = submit(client, "train", GPU_TRAIN | {"nproc_per_node": 4, "nnodes": 1})
        on_cpu = submit(client, "train", CPU_TRAIN | {"nproc_per_node": 8})  # processes, no GPUs

    assert refused.status_code == 422
    detail = refused.json()["detail"]
    assert "needs 8 GPUs per node" in detail and "has more than 4" in detail
    assert "TRAINCTL_MAX_GPUS_PER_NODE" in detail
    assert accepted.status_code == 202 and on_cpu.status_code == 202


def test_a_run_across_nodes_on_sqlite_is_422_saying_it_needs_postgresql(
    client: TestClient,
) -> None:
    response = submit(client, "train", CPU_TRAIN | {"nnodes": 2})

    assert response.status_code == 422
    assert "PostgreSQL" in response.json()["detail"]


def test_an_elastic_range_that_cannot_work_is_422_naming_nnodes(client: TestClient) -> None:
    backwards = submit(client, "train", CPU_TRAIN | {"nnodes": {"min": 3, "max": 2}})
    uneven = {"nnodes": {"min": 2, "max": 3}, "batch": {"grad_accum_steps": 4}}

    assert backwards.status_code == 422 and "nnodes" in str(backwards.json()["detail"])
    assert "min 3 is above max 2" in str(backwards.json()["detail"])
    refused = submit(client, "train", CPU_TRAIN | uneven)
    assert refused.status_code == 422 and "grad_accum_steps 4" in refused.json()["detail"]


def test_priority_and_max_attempts_are_kept_per_run(client: TestClient, settings: Settings) -> None:
    chosen = submit(client, "train", CPU_TRAIN | {"priority": 5, "max_attempts": 7}).json()
    default = submit(client, "benchmark", {"steps": 5, "device": "cpu"}).json()

    assert (chosen["priority"], chosen["max_attempts"]) == (5, 7)
    assert client.get(f"/runs/{chosen['id']}").json()["priority"] == 5
    assert (default["priority"], default["max_attempts"]) == (0, settings.max_attempts)
    assert "priority" not in chosen["spec"] and "max_attempts" not in chosen["spec"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("priority", 1001),
        ("priority", -1001),
        ("priority", "1"),
        ("max_attempts", 0),
        ("max_attempts", 101),
        ("max_attempts", 2.5),
        ("nnodes", 0),
        ("nnodes", 65),
        ("spread", "anywhere"),
    ],
)
def test_out_of_range_queueing_and_placement_fields_are_422_naming_the_field(
    client: TestClient, field: str, value: Any
) -> None:
    response = submit(client, "train", CPU_TRAIN | {field: value})

    assert response.status_code == 422
    assert field in response.json()["detail"]


def test_every_kind_takes_a_priority(client: TestClient) -> None:
    response = submit(client, "benchmark", {"steps": 5, "device": "cpu", "priority": -3})

    assert response.status_code == 202 and response.json()["priority"] == -3


def test_workers_show_their_node_gpus_and_cpus(client: TestClient, runs: RunStore) -> None:
    runs.workers.register(
        "gpu-1", host="n1", pid=1, device="cuda", node_name="rack-a",
        info={"gpus": ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"], "memory_bytes": 80 << 30},
        gpus=2, cpus=32, address="10.0.0.5",
    )  # fmt: skip
    runs.workers.register(
        "cpu-1", host="n2", pid=2, device="cpu", info={"memory_bytes": 16 << 30}, cpus=8
    )

    items = {w["id"]: w for w in client.get("/workers").json()["items"]}

    gpu, cpu = items["gpu-1"], items["cpu-1"]
    assert (gpu["node_name"], gpu["gpus"], gpu["cpus"], gpu["address"]) == (
        "rack-a",
        2,
        32,
        "10.0.0.5",
    )
    assert (gpu["gpu_model"], gpu["gpu_memory_bytes"]) == ("NVIDIA H100 80GB HBM3", 80 << 30)
    assert (cpu["node_name"], cpu["gpus"], cpu["cpus"], cpu["address"]) == ("n2", 0, 8, None)
    assert (cpu["gpu_model"], cpu["gpu_memory_bytes"]) == (None, None)
